from kev.config.load import ConfigSource, load_config
from kev.config.schema import KevConfig

__all__ = ["ConfigSource", "KevConfig", "load_config"]
