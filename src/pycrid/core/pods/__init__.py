"""Pod sandboxes, one CRI operation per module (containerd's layout): ``run``, ``stop``,
``remove``, ``status`` (status and list), ``update_resources``, ``pause_exit`` and
``recover``. Each is a function of ``PodParts`` (pod_parts.py), the parts they share."""
