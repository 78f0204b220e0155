"""Issue 14: the voice registry on S3 (`--voices-url`): what one replica uploads, another lists and
reads; a failed upload leaves the previous version."""

from __future__ import annotations

import boto3
import numpy as np
import pytest
from moto import mock_aws

from session_server.speech.voice_registry_s3 import S3VoiceRegistry, parse_voices_url


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="voices")
        yield client


def add(registry: S3VoiceRegistry, name: str, value: float) -> None:
    registry.add(name=name, consent="yes", samples=np.full(16000, value, np.float32), sample_rate=16000,
                 mime_type="audio/wav", file_size=100)


def test_a_voice_uploaded_through_one_replica_is_listed_and_read_by_another(s3):
    first = S3VoiceRegistry("s3://voices/team", client=s3)
    second = S3VoiceRegistry("s3://voices/team", client=s3)
    first.load()
    second.load()
    add(first, "narrator", 0.25)
    assert [voice.name for voice in second.list()] == ["narrator"]
    audio, rate = second.audio("narrator")
    assert rate == 16000 and float(audio[0]) == 0.25
    second.delete("narrator")
    assert first.list() == []


def test_a_failed_upload_leaves_the_previous_version(s3, monkeypatch):
    registry = S3VoiceRegistry("s3://voices/team", client=s3)
    registry.load()
    add(registry, "narrator", 0.25)

    def crash(**kwargs):
        raise ConnectionError("connection lost mid-upload")

    monkeypatch.setattr(s3, "put_object", crash)
    with pytest.raises(ConnectionError):
        add(registry, "narrator", 0.75)
    monkeypatch.undo()
    fresh = S3VoiceRegistry("s3://voices/team", client=s3)
    fresh.load()
    assert float(fresh.audio("narrator")[0][0]) == 0.25


def test_voices_url_must_be_an_s3_url():
    assert parse_voices_url("s3://bucket/a/b/") == ("bucket", "a/b/")
    assert parse_voices_url("s3://bucket") == ("bucket", "")
    with pytest.raises(ValueError, match="s3://BUCKET/PREFIX"):
        parse_voices_url("/tmp/voices")
