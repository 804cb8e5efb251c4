"""The hot-key sampler: sampled read traffic → frequent-items sketch → top-K hot posts in etcd."""

__all__ = ["publisher", "window"]
