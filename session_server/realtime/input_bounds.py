"""Bounds on what one client event may ask the model to read, checked before it reaches the graph.

- Text (a message item's text, a function output, `instructions`): at most
  `limits.max_text_tokens` tokens (default 16384), else `error` `text_too_long`. The server
  process holds no tokenizer, so it counts a text's UTF-8 bytes: a byte-level BPE tokenizer
  (Qwen's) never makes more tokens than bytes, so nothing over the limit gets through; non-ASCII
  text may be refused below its real token count (CJK: about 5,400 characters at the default).
- Images (`input_image` parts, `sglang.input_image.append`): a JPEG or PNG whose header says at
  most `limits.max_image_pixels` pixels (default 16,777,216 = 4096x4096) and whose structure
  checks out, else `error` `invalid_image`. Only the header and the PNG chunks are read here (a
  JPEG is decoded at 1/8 scale), never the full pixels, so a decompression bomb costs nothing.
"""

from __future__ import annotations

import io
import warnings

from session_server.realtime.events import RealtimeError

DEFAULT_MAX_TEXT_TOKENS = 16384
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


def check_text(text: str | None, max_tokens: int, param: str | None) -> None:
    if text and len(text) > max_tokens // 4 and len(text.encode("utf-8", "surrogatepass")) > max_tokens:
        raise RealtimeError(
            "text_too_long",
            f"The text is longer than this server's limit of {max_tokens} tokens (counted as UTF-8 bytes); send less text.",
            param,
        )


def check_image(data: bytes, max_pixels: int, param: str) -> None:
    """Raise `invalid_image` unless `data` is a well-formed JPEG/PNG of at most `max_pixels`."""
    if not data.startswith(_IMAGE_MAGIC):
        raise RealtimeError("invalid_image", "The image must be a JPEG or PNG.", param)
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise RealtimeError(
                        "invalid_image",
                        f"The image is {width}x{height} ({width * height} pixels); at most {max_pixels} pixels are accepted.",
                        param,
                    )
                if image.format == "JPEG":
                    # JPEG has no cheap structure check; decode at 1/8 scale (the DCT's own shortcut).
                    image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                    image.load()
                else:
                    image.verify()  # PNG: every chunk and its CRC, without inflating the pixels
    except RealtimeError:
        raise
    except Image.DecompressionBombError:  # PIL's own guard, past twice its MAX_IMAGE_PIXELS (~179 M)
        raise RealtimeError("invalid_image", f"The image has more than {max_pixels} pixels.", param) from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for a broken file; all are the client's
        raise RealtimeError("invalid_image", f"The image could not be read ({type(exc).__name__}).", param) from None
