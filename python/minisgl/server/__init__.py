"""Command line and (later) the HTTP server."""
