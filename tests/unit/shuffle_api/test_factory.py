"""``shuffle_api.factory``: the service factory loaded by name or class path, the
configuration checked against its options as it loads."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

import netty_like
from shuffle_api import ConfigError, Configuration, load_shuffle_service_factory

FACTORY_KEY = "shuffle-service-factory.class"


def test_default_factory_is_netty_like() -> None:
    factory = load_shuffle_service_factory(Configuration.load({}, environ={}))

    assert isinstance(factory, netty_like.NettyShuffleServiceFactory)


@pytest.mark.parametrize(
    "value",
    [
        "netty_like.NettyShuffleServiceFactory",
        "netty_like:NettyShuffleServiceFactory",
        "netty_like.factory.NettyShuffleServiceFactory",
        "netty_like",
        "  netty_like  ",
    ],
)
def test_factory_loads_from_dotted_path_colon_path_or_short_name(value: str) -> None:
    factory = load_shuffle_service_factory(Configuration.load({FACTORY_KEY: value}, environ={}))

    assert isinstance(factory, netty_like.NettyShuffleServiceFactory)


def test_factory_class_can_come_from_the_environment() -> None:
    configuration = Configuration.load(
        {}, environ={"PYSHUFFLE_SHUFFLE_SERVICE_FACTORY_CLASS": "netty_like"}
    )

    assert isinstance(
        load_shuffle_service_factory(configuration), netty_like.NettyShuffleServiceFactory
    )


@pytest.mark.parametrize(
    "value",
    [
        "no_such_module_for_pyshuffle_tests.Factory",
        "no_such_module_for_pyshuffle_tests:Factory",
        "collections.OrderedDict",
        "netty_like.NoSuchShuffleServiceFactory",
        "netty_like.NETTY_OPTIONS",
        "nodotsatall",
        "netty_like.",
        ":NettyShuffleServiceFactory",
    ],
)
def test_bad_factory_class_names_the_key_the_value_and_the_installed_services(
    value: str,
) -> None:
    configuration = Configuration.load({FACTORY_KEY: value}, environ={})

    with pytest.raises(ConfigError) as caught:
        load_shuffle_service_factory(configuration)

    message = str(caught.value)
    assert repr(FACTORY_KEY) in message
    assert repr(value) in message
    assert "netty_like (netty_like:NettyShuffleServiceFactory)" in message
    assert "installed services" in message


def test_factory_module_that_fails_while_importing_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"pyshuffle_broken_factory_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    value = f"{module}.Factory"

    with pytest.raises(ConfigError) as caught:
        load_shuffle_service_factory(Configuration.load({FACTORY_KEY: value}, environ={}))

    message = str(caught.value)
    assert repr(FACTORY_KEY) in message
    assert repr(value) in message
    assert "netty_like" in message


def test_abstract_factory_class_is_a_config_error() -> None:
    value = "shuffle_api.factory.ShuffleServiceFactory"

    with pytest.raises(ConfigError) as caught:
        load_shuffle_service_factory(Configuration.load({FACTORY_KEY: value}, environ={}))

    assert repr(FACTORY_KEY) in str(caught.value)
    assert repr(value) in str(caught.value)


def test_unknown_netty_key_is_rejected_when_the_factory_loads() -> None:
    configuration = Configuration.load({"netty-like.sort-bufer.size": "32m"}, environ={})

    with pytest.raises(ConfigError) as caught:
        load_shuffle_service_factory(configuration)

    message = str(caught.value)
    assert "'netty-like.sort-bufer.size'" in message
    assert "did you mean 'netty-like.sort-buffer.size'?" in message


def test_bad_netty_value_is_rejected_when_the_factory_loads() -> None:
    configuration = Configuration.load({}, environ={"PYSHUFFLE_NETTY_LIKE_NETWORK_MAX_CREDIT": "x"})

    with pytest.raises(ConfigError, match=re.escape("netty-like.network.max-credit")):
        load_shuffle_service_factory(configuration)


def test_known_netty_keys_are_accepted_when_the_factory_loads() -> None:
    configuration = Configuration.load(
        {"netty-like.sort-buffer.size": "32m", "netty-like.data-port.enabled": False},
        environ={"PYSHUFFLE_SHUFFLE_COMPRESSION_CODEC": "zstd"},
    )

    assert isinstance(
        load_shuffle_service_factory(configuration), netty_like.NettyShuffleServiceFactory
    )
