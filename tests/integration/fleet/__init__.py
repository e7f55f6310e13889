"""Real systemd hosts for the integration tests: Debian booted by systemd-nspawn, reached over SSH."""
from .fleet import Fleet, FleetError, missing_tools
from .host import DEVICE_NAMES, HostError
from .image import ImageError, ensure_image

__all__ = ["Fleet", "FleetError", "HostError", "ImageError", "DEVICE_NAMES", "ensure_image", "missing_tools"]
