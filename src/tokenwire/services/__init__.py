"""The services: gateway, assembler, telemetry, scripted provider (never importing each other)."""
