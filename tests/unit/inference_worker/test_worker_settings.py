from pathlib import Path

import pytest
from settings_env import loaded, refusal, undocumented

from attnstore.settings import SettingsError, load_settings
from inference_worker.settings import WorkerSettings


def test_environment_overrides_the_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = 'dtype = "bfloat16"\nchunk_tokens = 64\nkvstore_address = "10.0.0.1:50051"\n'
    settings = loaded(WorkerSettings, monkeypatch, tmp_path, toml, CHUNK_TOKENS="128")
    assert settings.dtype == "bfloat16"
    assert settings.chunk_tokens == 128
    assert settings.kvstore_address == "10.0.0.1:50051"
    assert settings.model_dir is None and settings.device == "auto"


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refusal(
        WorkerSettings,
        monkeypatch,
        DTYPE="float16",
        DEVICE="tpu",
        MAX_NEW_TOKENS="0",
        ATTENTION_SINK_TOKENS="-1",
        MAX_CONTEXT_TOKENS="1",
    )
    assert "ATTNSTORE_WORKER_DTYPE" in message and "'float16'" in message
    assert "ATTNSTORE_WORKER_DEVICE" in message and "'tpu'" in message
    assert "ATTNSTORE_WORKER_MAX_NEW_TOKENS" in message
    assert "ATTNSTORE_WORKER_ATTENTION_SINK_TOKENS" in message
    assert "ATTNSTORE_WORKER_MAX_CONTEXT_TOKENS" in message


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_device_names_are_accepted(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setenv("ATTNSTORE_WORKER_DEVICE", device)
    assert load_settings(WorkerSettings).device == device


def test_an_shm_dir_without_a_daemon_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSTORE_WORKER_KVSTORE_SHM_DIR", "/dev/shm")
    with pytest.raises(SettingsError, match="kvstore_shm_dir needs kvstore_address"):
        load_settings(WorkerSettings)


def test_readme_documents_every_setting() -> None:
    missing = undocumented(WorkerSettings)
    assert not missing, f"README's configuration table lacks {missing}"
