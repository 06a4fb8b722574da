"""``shuffle_api.config``: sources and their precedence, typed parsing, validation, and the
keys read on each host."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from netty_like.options import (
    DATA_PORT_ENABLED,
    DATA_PORT_HOST,
    INITIAL_CREDIT,
    MAX_CREDIT,
    NETTY_OPTIONS,
    PARTITION_REQUEST_TIMEOUT,
    SORT_BUFFER_SIZE,
    STORAGE_URL,
)
from shuffle_api import ConfigError, Configuration
from shuffle_api.config import ConfigOption, parse_memory_size
from shuffle_api.options import (
    COMPRESSION_CODEC,
    CORE_OPTIONS,
    HOST_CONFIG_FILE,
    SHUFFLE_SERVICE_FACTORY_CLASS,
    TARGET_BATCH_SIZE,
)

ALL_OPTIONS: tuple[ConfigOption[Any], ...] = (*CORE_OPTIONS, *NETTY_OPTIONS)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pyshuffle.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and sources ------------------------------------------------------------------


def test_unset_options_read_as_their_defaults() -> None:
    configuration = Configuration.load({}, environ={})

    assert configuration.get(COMPRESSION_CODEC) == "auto"
    assert configuration.get(TARGET_BATCH_SIZE) == 4 << 20
    assert configuration.get(SHUFFLE_SERVICE_FACTORY_CLASS) == "netty_like"
    assert configuration.get(SORT_BUFFER_SIZE) == 64 << 20
    assert configuration.get(DATA_PORT_ENABLED) is True
    assert configuration.get(PARTITION_REQUEST_TIMEOUT) == 30.0
    assert not configuration.contains(COMPRESSION_CODEC)


def test_unset_configuration_validates_against_every_known_option() -> None:
    Configuration.load({}, environ={}).validate(ALL_OPTIONS)


def test_env_name_is_the_prefixed_upper_case_key_with_separators_as_underscores() -> None:
    assert SORT_BUFFER_SIZE.env_name == "PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE"
    assert COMPRESSION_CODEC.env_name == "PYSHUFFLE_SHUFFLE_COMPRESSION_CODEC"
    assert SHUFFLE_SERVICE_FACTORY_CLASS.env_name == "PYSHUFFLE_SHUFFLE_SERVICE_FACTORY_CLASS"


def test_environment_variable_sets_a_memory_size() -> None:
    configuration = Configuration.load({}, environ={"PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE": "32m"})

    assert configuration.contains(SORT_BUFFER_SIZE)
    assert configuration.get(SORT_BUFFER_SIZE) == 32 << 20


def test_environment_variables_without_the_prefix_are_ignored() -> None:
    configuration = Configuration.load({}, environ={"HOME": "/root", "SORT_BUFFER_SIZE": "1"})

    configuration.validate(ALL_OPTIONS)
    assert configuration.get(SORT_BUFFER_SIZE) == 64 << 20


def test_toml_file_overrides_the_default(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[shuffle.compression]\ncodec = "zstd"\n')

    configuration = Configuration.load(toml_file=path, environ={})

    assert configuration.get(COMPRESSION_CODEC) == "zstd"


def test_environment_overrides_the_toml_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[shuffle.compression]\ncodec = "zstd"\n')

    configuration = Configuration.load(
        toml_file=path, environ={"PYSHUFFLE_SHUFFLE_COMPRESSION_CODEC": "none"}
    )

    assert configuration.get(COMPRESSION_CODEC) == "none"


def test_explicit_mapping_overrides_environment_and_toml_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[shuffle.compression]\ncodec = "zstd"\n')

    configuration = Configuration.load(
        {"shuffle.compression.codec": "lz4"},
        toml_file=path,
        environ={"PYSHUFFLE_SHUFFLE_COMPRESSION_CODEC": "none"},
    )

    assert configuration.get(COMPRESSION_CODEC) == "lz4"


def test_each_option_takes_its_own_highest_precedence_source(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        "[netty-like.network]\ninitial-credit = 3\nmax-credit = 5\n"
        "[netty-like.data-port]\nhost = 'toml-host'\n",
    )

    configuration = Configuration.load(
        {"netty-like.network.initial-credit": 7},
        toml_file=path,
        environ={"PYSHUFFLE_NETTY_LIKE_NETWORK_MAX_CREDIT": "6"},
    )

    assert configuration.get(INITIAL_CREDIT) == 7
    assert configuration.get(MAX_CREDIT) == 6
    assert configuration.get(DATA_PORT_HOST) == "toml-host"


def test_toml_nested_tables_and_dotted_keys_flatten_to_dotted_option_keys(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        '"shuffle-service-factory".class = "netty_like"\n'
        "[netty-like]\n"
        'sort-buffer.size = "16m"\n'
        "[netty-like.network]\n"
        "initial-credit = 4\n",
    )

    configuration = Configuration.load(toml_file=path, environ={})

    assert configuration.to_dict() == {
        "shuffle-service-factory.class": "netty_like",
        "netty-like.sort-buffer.size": "16m",
        "netty-like.network.initial-credit": 4,
    }
    assert configuration.get(SORT_BUFFER_SIZE) == 16 << 20
    assert configuration.get(INITIAL_CREDIT) == 4
    configuration.validate(ALL_OPTIONS)


def test_with_values_layers_a_mapping_over_every_source() -> None:
    base = Configuration.load(
        {"shuffle.compression.codec": "zstd"},
        environ={"PYSHUFFLE_NETTY_LIKE_NETWORK_MAX_CREDIT": "6"},
    )

    layered = base.with_values(
        {"shuffle.compression.codec": "none", "netty-like.network.max-credit": 9}
    )

    assert layered.get(COMPRESSION_CODEC) == "none"
    assert layered.get(MAX_CREDIT) == 9
    assert base.get(COMPRESSION_CODEC) == "zstd"


# --- memory sizes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("64m", 64 << 20),
        ("64 MiB", 64 << 20),
        ("64mb", 64 << 20),
        (1024, 1024),
        ("1024", 1024),
        ("1g", 1 << 30),
        ("8k", 8 << 10),
        (" 2 GB ", 2 << 30),
        ("1t", 1 << 40),
        ("0", 0),
    ],
)
def test_memory_size_parses_bytes_and_binary_units(value: object, expected: int) -> None:
    assert parse_memory_size(value) == expected


@pytest.mark.parametrize("value", ["12 parsecs", -1, True, "-1m", "1.5g", "", "m", 1.5, None])
def test_memory_size_rejects_what_is_not_a_size(value: object) -> None:
    with pytest.raises(ValueError):
        parse_memory_size(value)


@pytest.mark.parametrize("value", ["12 parsecs", -1, True])
def test_bad_memory_size_from_the_mapping_names_key_value_and_source(value: object) -> None:
    configuration = Configuration.load({"netty-like.sort-buffer.size": value}, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.get(SORT_BUFFER_SIZE)

    message = str(caught.value)
    assert "'netty-like.sort-buffer.size'" in message
    assert repr(value) in message
    assert "the given mapping" in message


def test_bad_memory_size_from_the_environment_names_the_variable() -> None:
    configuration = Configuration.load(
        {}, environ={"PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE": "12 parsecs"}
    )

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    message = str(caught.value)
    assert "'netty-like.sort-buffer.size'" in message
    assert "'12 parsecs'" in message
    assert "environment variable PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE" in message


def test_bad_memory_size_from_the_toml_file_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[netty-like.sort-buffer]\nsize = -1\n")
    configuration = Configuration.load(toml_file=path, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.get(SORT_BUFFER_SIZE)

    message = str(caught.value)
    assert "'netty-like.sort-buffer.size'" in message
    assert "-1" in message
    assert str(path) in message


def test_memory_size_below_the_option_minimum_is_rejected() -> None:
    configuration = Configuration.load({"shuffle.batch.target-size": "1k"}, environ={})
    assert configuration.get(TARGET_BATCH_SIZE) == 1024

    too_small = Configuration.load({"shuffle.batch.target-size": 1023}, environ={})
    with pytest.raises(ConfigError, match=re.escape("shuffle.batch.target-size")):
        too_small.get(TARGET_BATCH_SIZE)


# --- typed parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("YES", True), ("on", True), ("1", True), ("false", False), ("Off", False),
     ("0", False), (False, False)],
)  # fmt: skip
def test_bool_option_parses_the_usual_spellings(value: object, expected: bool) -> None:
    configuration = Configuration.load({DATA_PORT_ENABLED.key: value}, environ={})

    assert configuration.get(DATA_PORT_ENABLED) is expected


@pytest.mark.parametrize(
    ("option", "value"),
    [
        (DATA_PORT_ENABLED, "maybe"),
        (DATA_PORT_ENABLED, 1),
        (INITIAL_CREDIT, "two"),
        (INITIAL_CREDIT, "1.5"),
        (INITIAL_CREDIT, True),
        (INITIAL_CREDIT, 2.0),
        (INITIAL_CREDIT, 0),
        (PARTITION_REQUEST_TIMEOUT, "soon"),
        (PARTITION_REQUEST_TIMEOUT, True),
        (PARTITION_REQUEST_TIMEOUT, -0.5),
        (COMPRESSION_CODEC, "snappy"),
        (COMPRESSION_CODEC, 4),
        (DATA_PORT_HOST, 127),
    ],
)
def test_unparsable_value_error_names_the_key_and_the_value(
    option: ConfigOption[Any], value: object
) -> None:
    configuration = Configuration.load({option.key: value}, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.get(option)

    message = str(caught.value)
    assert repr(option.key) in message
    assert repr(value) in message
    assert "the given mapping" in message


def test_unparsable_value_is_also_caught_by_validate() -> None:
    configuration = Configuration.load({INITIAL_CREDIT.key: "two"}, environ={})

    with pytest.raises(ConfigError, match=re.escape("netty-like.network.initial-credit")):
        configuration.validate(ALL_OPTIONS)


def test_int_and_float_options_parse_numbers_given_as_strings() -> None:
    configuration = Configuration.load(
        {INITIAL_CREDIT.key: " 1_000 ", PARTITION_REQUEST_TIMEOUT.key: "2.5"}, environ={}
    )

    assert configuration.get(INITIAL_CREDIT) == 1000
    assert configuration.get(PARTITION_REQUEST_TIMEOUT) == 2.5


def test_float_option_accepts_an_int() -> None:
    configuration = Configuration.load({PARTITION_REQUEST_TIMEOUT.key: 3}, environ={})

    value = configuration.get(PARTITION_REQUEST_TIMEOUT)

    assert value == 3.0
    assert isinstance(value, float)


def test_choice_option_is_case_insensitive_and_lists_the_choices_on_error() -> None:
    assert (
        Configuration.load({COMPRESSION_CODEC.key: " ZSTD "}, environ={}).get(COMPRESSION_CODEC)
        == "zstd"
    )

    with pytest.raises(ConfigError) as caught:
        Configuration.load({COMPRESSION_CODEC.key: "snappy"}, environ={}).get(COMPRESSION_CODEC)
    message = str(caught.value)
    assert "none|lz4|zstd" in message
    assert message.count("lz4") == 1  # listed once, not once per layer of the error


def test_non_string_mapping_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match="42"):
        Configuration.load({42: "x"}, environ={})  # type: ignore[dict-item]


# --- unknown keys --------------------------------------------------------------------------


def test_unknown_key_names_the_key_and_suggests_the_closest() -> None:
    configuration = Configuration.load({"shuffle.compression.codex": "lz4"}, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    message = str(caught.value)
    assert "'shuffle.compression.codex'" in message
    assert "did you mean 'shuffle.compression.codec'?" in message


def test_unknown_key_from_the_toml_file_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[netty-like.network]\ninitial-credits = 4\n")
    configuration = Configuration.load(toml_file=path, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    message = str(caught.value)
    assert "'netty-like.network.initial-credits'" in message
    assert str(path) in message
    assert "did you mean 'netty-like.network.initial-credit'?" in message


def test_unknown_key_with_nothing_close_gets_no_suggestion() -> None:
    configuration = Configuration.load({"zzzzzz": 1}, environ={})

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    assert "'zzzzzz'" in str(caught.value)
    assert "did you mean" not in str(caught.value)


def test_every_unknown_key_is_reported_at_once() -> None:
    configuration = Configuration.load(
        {"netty-like.sort-bufer.size": "1m", "shuffle.compresion.codec": "lz4"}, environ={}
    )

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    assert "'netty-like.sort-bufer.size'" in str(caught.value)
    assert "'shuffle.compresion.codec'" in str(caught.value)


def test_unknown_pyshuffle_environment_variable_is_rejected_with_a_suggestion() -> None:
    configuration = Configuration.load({}, environ={"PYSHUFFLE_NETTY_LIKE_SORT_BUFER_SIZE": "32m"})

    with pytest.raises(ConfigError) as caught:
        configuration.validate(ALL_OPTIONS)

    message = str(caught.value)
    assert "'PYSHUFFLE_NETTY_LIKE_SORT_BUFER_SIZE'" in message
    assert "environment" in message
    assert "did you mean 'PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE'?" in message


# --- the TOML file itself ------------------------------------------------------------------


def test_invalid_toml_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[netty-like\nsort-buffer.size = \n")

    with pytest.raises(ConfigError) as caught:
        Configuration.load(toml_file=path, environ={})

    assert str(path) in str(caught.value)
    assert "TOML" in str(caught.value)


def test_missing_toml_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "does-not-exist.toml"

    with pytest.raises(ConfigError) as caught:
        Configuration.load(toml_file=path, environ={})

    assert str(path) in str(caught.value)


# --- host-local keys -----------------------------------------------------------------------


def test_host_local_keys_are_read_from_the_executors_own_environment() -> None:
    # Loaded on the driver: a Spark conf value, and the driver's own variables.
    driver = Configuration.load(
        {"netty-like.data-port.host": "10.0.0.1", "shuffle.compression.codec": "lz4"},
        environ={
            "PYSHUFFLE_NETTY_LIKE_SORT_BUFFER_SIZE": "1m",
            "PYSHUFFLE_SHUFFLE_BATCH_TARGET_SIZE": "2m",
        },
    )
    executor_env = {
        "PYSHUFFLE_NETTY_LIKE_DATA_PORT_HOST": "10.0.0.7",
        "PYSHUFFLE_SHUFFLE_COMPRESSION_CODEC": "zstd",  # job-wide: the driver's value stands
    }
    on_executor = driver.on_host(NETTY_OPTIONS + CORE_OPTIONS, executor_env)
    assert on_executor.get(DATA_PORT_HOST) == "10.0.0.7"  # the executor's own, above Spark conf
    assert on_executor.get(SORT_BUFFER_SIZE) == SORT_BUFFER_SIZE.default  # not the driver's
    assert on_executor.get(TARGET_BATCH_SIZE) == 2 << 20  # job-wide: the driver's variable
    assert on_executor.get(COMPRESSION_CODEC) == "lz4"
    # Set nowhere on the executor: the driver's explicit value is used there too.
    assert driver.on_host(NETTY_OPTIONS, {}).get(DATA_PORT_HOST) == "10.0.0.1"


def test_a_host_config_file_sets_host_local_keys_below_the_hosts_own_variables(
    tmp_path: Path,
) -> None:
    host_file = tmp_path / "host.toml"
    host_file.write_text(
        '[netty-like]\nstorage.url = "file:///mnt/ssd/shuffle"\ndata-port.host = "10.0.0.8"\n'
    )
    driver = Configuration.load(
        {"netty-like.data-port.host": "10.0.0.1", "netty-like.storage.url": "file:///tmp/x"},
        environ={},
    )
    executor_env = {
        "PYSHUFFLE_SHUFFLE_HOST_CONFIG_FILE": str(host_file),
        "PYSHUFFLE_NETTY_LIKE_DATA_PORT_HOST": "10.0.0.9",
    }
    on_executor = driver.on_host(NETTY_OPTIONS + CORE_OPTIONS, executor_env)
    assert on_executor.get(STORAGE_URL) == "file:///mnt/ssd/shuffle"  # the file, above the driver
    assert on_executor.get(DATA_PORT_HOST) == "10.0.0.9"  # the host's variable, above the file
    # Named by the driver (the same path on every host, as a mounted ConfigMap is).
    named_by_driver = driver.with_values({HOST_CONFIG_FILE.key: str(host_file)})
    assert named_by_driver.on_host(NETTY_OPTIONS + CORE_OPTIONS, {}).get(STORAGE_URL) == (
        "file:///mnt/ssd/shuffle"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('shuffle.compression.codec = "zstd"\n', "describes the job, not the host"),
        ("[netty-like]\nsort-bufer.size = 1\n", "did you mean 'netty-like.sort-buffer.size'"),
        ("netty-like = [\n", "is not valid TOML"),
    ],
)
def test_a_host_config_file_with_a_job_wide_unknown_or_broken_key_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    host_file = tmp_path / "host.toml"
    host_file.write_text(text)
    driver = Configuration.load({}, environ={})
    env = {"PYSHUFFLE_SHUFFLE_HOST_CONFIG_FILE": str(host_file)}
    with pytest.raises(ConfigError, match=re.escape(message)):
        driver.on_host(NETTY_OPTIONS + CORE_OPTIONS, env)


def test_a_missing_host_config_file_is_a_config_error(tmp_path: Path) -> None:
    env = {"PYSHUFFLE_SHUFFLE_HOST_CONFIG_FILE": str(tmp_path / "absent.toml")}
    with pytest.raises(ConfigError, match="cannot read config file"):
        Configuration.load({}, environ={}).on_host(NETTY_OPTIONS + CORE_OPTIONS, env)
