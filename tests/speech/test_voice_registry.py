"""The uploaded-voice registry: safetensors files on disk, restored on restart."""

import os

import numpy as np
import pytest
from safetensors import safe_open

from session_server.speech.voice_registry import VoiceError, VoiceRegistry

BUILTIN = {"Ethan", "Chelsie"}


def registry(directory, **kwargs) -> VoiceRegistry:
    voices = VoiceRegistry(directory, builtin=BUILTIN, **kwargs)
    voices.load()
    return voices


def add(voices: VoiceRegistry, name: str, seconds: float = 2.0, value: float = 0.1, **extra):
    samples = np.full(int(seconds * 16000), value, dtype=np.float32)
    return voices.add(
        name=name, consent="consent-1", samples=samples, sample_rate=16000, mime_type="audio/wav", file_size=1234, **extra
    )


def test_a_voice_is_one_safetensors_file_with_audio_and_metadata_in_the_header(tmp_path):
    voices = registry(tmp_path)
    add(voices, "narrator", ref_text="Hello there.", speaker_description="warm")
    files = [p for p in tmp_path.iterdir()]
    assert len(files) == 1 and files[0].suffix == ".safetensors"
    with safe_open(str(files[0]), framework="numpy") as handle:
        assert handle.get_tensor("audio").shape == (32000,)
        header = handle.metadata()
    assert '"name": "narrator"' in header["voice"] and '"ref_text": "Hello there."' in header["voice"]


def test_voices_are_restored_on_restart(tmp_path):
    add(registry(tmp_path), "narrator", ref_text="Hi.")
    restored = registry(tmp_path)
    [voice] = restored.list()
    assert (voice.name, voice.consent, voice.ref_text, voice.sample_rate) == ("narrator", "consent-1", "Hi.", 16000)
    samples, rate = restored.audio("narrator")
    assert rate == 16000 and samples.shape == (32000,)


def test_public_entry_omits_unset_optional_fields(tmp_path):
    voice, _ = add(registry(tmp_path), "plain")
    assert set(voice.public()) == {"name", "consent", "created_at", "file_size", "mime_type"}


@pytest.mark.parametrize("name", ["", " ", "a/b", "a\\b", "nul\x00byte", ".", "..", "ethan", "Chelsie", "x" * 129])
def test_unsafe_or_builtin_names_are_rejected(tmp_path, name):
    with pytest.raises(VoiceError) as caught:
        add(registry(tmp_path), name)
    assert caught.value.status == 400
    assert list(tmp_path.iterdir()) == []


def test_names_with_dots_and_unicode_are_fine(tmp_path):
    voices = registry(tmp_path)
    add(voices, "alice.v2")
    add(voices, "语音 1")
    assert {v.name for v in registry(tmp_path).list()} == {"alice.v2", "语音 1"}


def test_overwrite_policy_replaces_the_voice(tmp_path):
    voices = registry(tmp_path)
    add(voices, "narrator", value=0.1)
    _, replaced = add(voices, "narrator", value=0.2)
    assert replaced and len(voices.list()) == 1
    assert np.allclose(voices.audio("narrator")[0], 0.2)
    assert len(list(tmp_path.iterdir())) == 1


def test_immutable_policy_refuses_a_second_upload_until_deleted(tmp_path):
    voices = registry(tmp_path, policy="immutable")
    add(voices, "narrator", value=0.1)
    with pytest.raises(VoiceError) as caught:
        add(voices, "narrator", value=0.2)
    assert caught.value.status == 409 and caught.value.code == "voice_exists"
    assert np.allclose(voices.audio("narrator")[0], 0.1)
    voices.delete("narrator")
    add(voices, "narrator", value=0.2)
    assert np.allclose(voices.audio("narrator")[0], 0.2)


def test_the_cap_limits_new_names_but_not_replacements(tmp_path):
    voices = registry(tmp_path, max_voices=2)
    add(voices, "a")
    add(voices, "b")
    with pytest.raises(VoiceError) as caught:
        add(voices, "c")
    assert caught.value.status == 400 and caught.value.code == "voice_limit_reached"
    add(voices, "a", value=0.3)  # replacing an existing name is not a new voice
    assert {v.name for v in voices.list()} == {"a", "b"}


def test_too_short_or_too_long_audio_is_rejected_and_keeps_the_old_voice(tmp_path):
    voices = registry(tmp_path, min_seconds=1.0, max_seconds=5.0)
    add(voices, "narrator", value=0.1)
    for seconds in (0.5, 6.0):
        with pytest.raises(VoiceError) as caught:
            add(voices, "narrator", seconds=seconds, value=0.9)
        assert caught.value.status == 400 and caught.value.code == "invalid_audio"
    assert np.allclose(registry(tmp_path).audio("narrator")[0], 0.1)


def test_a_failed_write_never_destroys_the_existing_voice(tmp_path, monkeypatch):
    voices = registry(tmp_path)
    add(voices, "narrator", value=0.1)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("session_server.speech.voice_registry.save_file", disk_full)
    with pytest.raises(OSError):
        add(voices, "narrator", value=0.9)
    monkeypatch.undo()
    assert np.allclose(voices.audio("narrator")[0], 0.1)
    assert np.allclose(registry(tmp_path).audio("narrator")[0], 0.1)
    assert [p.name.startswith(".tmp-") for p in tmp_path.iterdir()] == [False]


def test_delete_removes_the_file_and_unknown_names_are_404(tmp_path):
    voices = registry(tmp_path)
    add(voices, "narrator")
    voices.delete("narrator")
    assert list(tmp_path.iterdir()) == [] and registry(tmp_path).list() == []
    with pytest.raises(VoiceError) as caught:
        voices.delete("narrator")
    assert caught.value.status == 404


def test_restart_skips_corrupt_files_leftovers_and_builtin_collisions(tmp_path):
    add(registry(tmp_path), "narrator")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / ".tmp-deadbeef.safetensors").write_bytes(b"half written")
    later = VoiceRegistry(tmp_path, builtin=BUILTIN | {"Narrator"})  # the model now has that speaker
    later.load()
    assert later.list() == []
    assert not (tmp_path / ".tmp-deadbeef.safetensors").exists()
    assert [v.name for v in registry(tmp_path).list()] == ["narrator"]


def test_unknown_policy_is_a_configuration_error(tmp_path):
    with pytest.raises(ValueError):
        VoiceRegistry(tmp_path, policy="sometimes")
    assert os.listdir(tmp_path) == []


def test_replicas_sharing_a_directory_see_each_others_changes(tmp_path):
    first, second = registry(tmp_path), registry(tmp_path)
    add(first, "shared", value=0.1)
    assert [v.name for v in second.list()] == ["shared"]
    assert np.allclose(second.audio("shared")[0], 0.1)
    second.delete("shared")
    assert first.get("shared") is None and first.list() == []
