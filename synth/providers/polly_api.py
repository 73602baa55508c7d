"""kind = "polly": Amazon Polly's SynthesizeSpeech over aiohttp, signed with botocore's SigV4
signer, as docs/upstreams.md, "Providers", has it (and why not aiobotocore)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

from synth.engine import SynthesisItem
from synth.providers.base import (
    ProviderConfig,
    ProviderError,
    ProviderSpec,
    error_for_status,
    provider_message,
    retry_after_of,
)
from synth.providers.http_api import HttpCall, HttpProvider, json_error_message

# Amazon Polly's engines (SynthesizeSpeech's Engine; the entry's `model`).
ENGINES = ("standard", "neural", "long-form", "generative")

# Error codes AWS uses for throttling (botocore's retry handler treats them as such).
THROTTLING = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)


def error_code(headers: dict[str, str], body: bytes) -> str:
    """The AWS error code of a rest-json error answer: ``x-amzn-ErrorType`` (``Code:uri``),
    else the body's ``__type`` (``namespace#Code``) or ``code``."""
    code = headers.get("x-amzn-errortype", "").split(":", 1)[0]
    if not code:
        code = json_error_message(body, ("__type",), ("code",), ("Code",))
        if code.startswith(("{", "[")) or " " in code:
            code = ""
    return code.rsplit("#", 1)[-1]


def aws_region(config: ProviderConfig) -> str:
    """The entry's ``region``, else the region in a ``polly.<region>.amazonaws.com`` host."""
    if config.region:
        return config.region
    found = re.fullmatch(
        r"polly(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?",
        urlsplit(config.base_url).hostname or "",
    )
    return found.group(1) if found else ""


def check(config: ProviderConfig) -> None:
    """What an entry of kind polly needs beyond the spec's rules."""
    if config.model not in ("", *ENGINES):
        raise ValueError("the model of kind polly is its Engine: " + ", ".join(ENGINES))
    if not config.api_key_env:
        raise ValueError("kind polly needs api_key_env (the secret access key) and key_id_env")
    if not aws_region(config):
        raise ValueError("kind polly needs region, or a base_url host polly.<region>.amazonaws.com")


class PollyProvider(HttpProvider):
    """The provider of Polly's SynthesizeSpeech."""

    error_paths = (("message",), ("Message",))
    speeds = (0.2, 2.0)
    speed_refusal = "Polly speaks at 0.2 to 2 times the normal rate"

    def __init__(self, config: ProviderConfig, api_key: str, environ: Mapping[str, str]) -> None:
        # botocore comes with the polly extra: imported once an upstream of kind polly is made.
        from botocore.credentials import Credentials

        super().__init__(config, api_key, environ)
        token = environ.get(config.session_token_env, "") if config.session_token_env else ""
        key_id = environ.get(config.key_id_env, "")
        self._credentials = Credentials(key_id, api_key, token or None)
        self._region = aws_region(config)

    def request(self, item: SynthesisItem) -> HttpCall:
        c = self.config
        body: dict[str, object] = {
            "OutputFormat": "pcm",
            "SampleRate": str(c.sample_rate),
            "VoiceId": item.voice,
        }
        if item.speed != 1.0:
            rate = quoteattr(f"{round(item.speed * 100)}%")
            body["Text"] = f"<speak><prosody rate={rate}>{escape(item.text)}</prosody></speak>"
            body["TextType"] = "ssml"
        else:
            body["Text"] = item.text
            body["TextType"] = "text"
        if c.model:
            body["Engine"] = c.model
        if c.language:
            body["LanguageCode"] = c.language.replace("_", "-")  # en_US is Polly's en-US
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        data = json.dumps(body, separators=(",", ":")).encode()
        url = f"{c.base_url}/v1/speech"
        signed = AWSRequest(
            method="POST", url=url, data=data, headers={"Content-Type": "application/json"}
        )
        SigV4Auth(self._credentials, "polly", self._region).add_auth(signed)
        return HttpCall(url=url, headers=dict(signed.headers.items()), data=data)

    def error_of(self, status: int, headers: dict[str, str], body: bytes) -> ProviderError:
        code = error_code(headers, body)
        message = provider_message(self.error_message(body))
        if code:
            message = provider_message(f"{code}: {message}")
        throttled = code in THROTTLING
        if status == 404 and not throttled:
            # LexiconNotFoundException: the request named what the account does not have.
            return ProviderError("refused", message, status=status)
        return error_for_status(status, message, retry_after_of(headers), throttled)


SPEC = ProviderSpec(
    "polly",
    PollyProvider,
    rates=(8000, 16000),
    sends_language=True,
    reads_numbers=True,
    sdk="botocore",
    owns=("region", "session_token_env"),
    secret_envs=(("key_id_env", "the access key id"),),
    check=check,
)
