"""Configuration: a TOML file, overridden by EFD_* environment variables.

Every problem is reported with the key it concerns, all at once, so an operator fixes a
config in one pass. Unknown keys are errors, at every depth. The models are in
efd.config.models, the rules that span entries in efd.config.checks, the reading in
efd.config.loading; this module exports what the rest of efd uses.
"""

from efd.config.loading import ConfigError, ConfigFileError, load
from efd.config.models import (
    MAX_HOOKS,
    MIN_ADMIN_TOKEN_CHARS,
    AudienceConfig,
    ComputedTraitConfig,
    DeliveryConfig,
    DestinationConfig,
    FieldsConfig,
    FilterAction,
    FilterConfig,
    HookConfig,
    LoggingConfig,
    Seconds,
    ServerConfig,
    Settings,
    Signing,
    SourceConfig,
    StorageConfig,
)

__all__ = [
    "MAX_HOOKS",
    "MIN_ADMIN_TOKEN_CHARS",
    "AudienceConfig",
    "ComputedTraitConfig",
    "ConfigError",
    "ConfigFileError",
    "DeliveryConfig",
    "DestinationConfig",
    "FieldsConfig",
    "FilterAction",
    "FilterConfig",
    "HookConfig",
    "LoggingConfig",
    "Seconds",
    "ServerConfig",
    "Settings",
    "Signing",
    "SourceConfig",
    "StorageConfig",
    "load",
]
