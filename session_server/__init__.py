"""The server process: transports (WebSocket, WebRTC, telephony, HTTP), the protocols and audio
coding; it builds on graph/, reaches the nodes only by name through a profile, and never imports
torch (docs/ARCHITECTURE.md)."""
