"""containerd's API, read-only, for the kubelet's built-in cAdvisor.

The kubelet's cAdvisor names a cgroup as a pod's container only for runtimes it has a
driver for. Its containerd driver asks containerd's Containers, Tasks and Version
services (gRPC, namespace ``k8s.io``) about every cgroup whose last path element carries
a 64-hex id: labels (``io.kubernetes.*``, ``io.cri-containerd.kind``), image, OCI spec,
and the task's pid (network counters are read from that pid's /proc for the sandbox
kind). pycrid's cgroup layout is containerd's, so serving those few calls on the socket
the driver dials (``socket_path``, the kubelet's ``--containerd``) is all it takes for
``/stats/summary`` and ``/metrics/cadvisor`` to see pycrid's pods.

``proto/`` declares the messages, ``objects`` builds them from records (pure),
``filters`` is containerd's filter syntax (Containers.List), ``view`` reads the records
and files, ``service`` the gRPC services, ``server`` the socket and its server.
"""
