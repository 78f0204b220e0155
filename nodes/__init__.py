"""The stages of the card (VAD, dialog, thinker, talker, code2wav...), each a node built on
graph/; a profile's `imports:` names them, and nothing here imports session_server."""
