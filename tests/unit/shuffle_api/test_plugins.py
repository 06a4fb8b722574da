"""A service from another distribution plugs in as pyshuffle's own do: through entry points.

The third-party package here is installed as pip installs one (a ``*.dist-info`` folder with
its ``entry_points.txt`` beside the package, on the path), not imported by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from netty_like import NettyShuffleServiceFactory
from shuffle_api import ConfigError, Configuration, ResultPartitionID, SerializationError
from shuffle_api.factory import load_shuffle_service_factory
from shuffle_api.ids import IntermediateResultPartitionID
from shuffle_api.plugins import SERVICES, load_plugin, plugins
from shuffle_api.serialization import deserialize, serialize
from tests.pyshuffle_command import pyshuffle

PACKAGE = "tiered_shuffle_example"

MODULE = '''
"""A third party's service: the default one with a tier of its own."""

from dataclasses import dataclass
from typing import ClassVar

from netty_like import NettyShuffleServiceFactory
from shuffle_api.config import str_option
from shuffle_api.descriptors import ShuffleDescriptor
from shuffle_api.plugins import Command, OptionCatalog, OptionRole

TIER = str_option("tiered-example.tier", "warm", "Which tier the example service writes to.")
CATALOG = OptionCatalog("tiered example service", OptionRole.SERVICE, (TIER,))


class TieredFactory(NettyShuffleServiceFactory):
    @classmethod
    def config_options(cls):
        return (*super().config_options(), TIER)


@dataclass(frozen=True, slots=True)
class TieredDescriptor(ShuffleDescriptor):
    kind: ClassVar[str] = "tiered_example"
    partition: object
    tier: str

    @property
    def result_partition_id(self):
        return self.partition

    def stores_local_resources_on(self):
        return None

    def details_to_bytes(self):
        return self.tier.encode()

    @classmethod
    def from_details(cls, result_partition_id, details):
        return cls(result_partition_id, details.decode())


def _hello(argv):
    print("hello from the tiered example", *argv)
    return 0


HELLO = Command("say hello from a third-party package", _hello)
'''

ENTRY_POINTS = f"""
[pyshuffle.services]
tiered_example = {PACKAGE}:TieredFactory

[pyshuffle.descriptor_kinds]
tiered_example = {PACKAGE}:TieredDescriptor

[pyshuffle.option_catalogs]
tiered_example = {PACKAGE}:CATALOG

[pyshuffle.commands]
tiered-hello = {PACKAGE}:HELLO
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The third-party package installed in a folder on this process's path (and given to
    child processes through PYTHONPATH); the entry points are read anew."""
    (tmp_path / f"{PACKAGE}.py").write_text(textwrap.dedent(MODULE))
    metadata = tmp_path / f"{PACKAGE}-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    plugins.cache_clear()
    yield tmp_path
    plugins.cache_clear()


def test_pyshuffles_own_services_are_found_by_their_entry_point_names() -> None:
    assert {"netty_like", "external_shuffle"} <= set(plugins(SERVICES))
    assert load_plugin(SERVICES, "netty_like") is NettyShuffleServiceFactory


def test_an_installed_service_is_chosen_by_its_name(installed: Path) -> None:
    configuration = Configuration.load(
        {"shuffle-service-factory.class": "tiered_example", "tiered-example.tier": "cold"},
        environ={},
    )

    factory = load_shuffle_service_factory(configuration)

    assert type(factory).__name__ == "TieredFactory"
    assert type(factory).__module__ == PACKAGE


def test_an_installed_services_own_keys_are_refused_on_another_service(
    installed: Path,
) -> None:
    configuration = Configuration.load({"tiered-example.tier": "cold"}, environ={})

    with pytest.raises(ConfigError, match=r"tiered-example\.tier"):
        load_shuffle_service_factory(configuration)


def test_a_service_not_installed_is_named_with_those_that_are() -> None:
    configuration = Configuration.load(
        {"shuffle-service-factory.class": "tiered_example"}, environ={}
    )

    with pytest.raises(ConfigError) as caught:
        load_shuffle_service_factory(configuration)

    assert "'tiered_example'" in str(caught.value)
    assert "external_shuffle (external_shuffle:ExternalShuffleServiceFactory)" in str(caught.value)


def test_an_installed_descriptor_kind_decodes_in_a_process_that_never_imported_it(
    installed: Path,
) -> None:
    script = textwrap.dedent(
        """
        import sys
        from shuffle_api.serialization import deserialize
        descriptor = deserialize(sys.stdin.buffer.read())
        print(type(descriptor).__module__, descriptor.tier)
        """
    )
    module = __import__(PACKAGE)
    partition = ResultPartitionID(IntermediateResultPartitionID("result-1", 0), "attempt-1")
    data = serialize(module.TieredDescriptor(partition, "cold"))

    completed = subprocess.run(
        [sys.executable, "-c", script], input=data, capture_output=True, check=True, timeout=60
    )

    assert completed.stdout.decode().split() == [PACKAGE, "cold"]


def test_a_descriptor_kind_nobody_installed_is_a_serialization_error(installed: Path) -> None:
    module = __import__(PACKAGE)
    partition = ResultPartitionID(IntermediateResultPartitionID("result-1", 0), "attempt-1")
    data = serialize(module.TieredDescriptor(partition, "cold")).replace(
        b"tiered_example", b"tiered_elsewhe"
    )

    with pytest.raises(SerializationError, match="tiered_elsewhe"):
        deserialize(data)


def test_pyshuffle_options_lists_and_checks_an_installed_services_keys(installed: Path) -> None:
    listed = pyshuffle("options")
    config = installed / "client.toml"
    config.write_text(
        'shuffle-service-factory.class = "tiered_example"\ntiered-example.tier = "cold"\n'
    )
    checked = pyshuffle("options", "--config", str(config))

    assert listed.returncode == 0, listed.stderr
    assert "# tiered example service\ntiered-example.tier = 'warm'" in listed.stdout
    assert checked.returncode == 0, checked.stderr
    assert "tiered-example.tier = 'cold'" in checked.stdout


def test_an_installed_command_runs_and_is_listed(installed: Path) -> None:
    listed = pyshuffle("--help")
    ran = pyshuffle("tiered-hello", "world")

    assert "tiered-hello" in listed.stdout
    assert "say hello from a third-party package" in listed.stdout
    assert (ran.returncode, ran.stdout) == (0, "hello from the tiered example world\n")
