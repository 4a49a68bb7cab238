"""devcluster: a real, local Kubernetes control plane for PDPair's tests and demos.

Role: start/stop etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok (simulated nodes) on 127.0.0.1 from binaries built by ``hack/build-k8s.sh``
(:mod:`devcluster.cluster`), and run the agent containers of the pods that kwok
marks Running as local processes on loopback addresses (:mod:`devcluster.podrunner`).
"""

from devcluster.cluster import Cluster, ClusterError, bin_dir
from devcluster.podrunner import PodRunner

__all__ = ["Cluster", "ClusterError", "PodRunner", "bin_dir"]
