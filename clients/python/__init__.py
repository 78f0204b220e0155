"""Python client for the session server: plays a WAV into a realtime session (WebSocket or WebRTC)."""
