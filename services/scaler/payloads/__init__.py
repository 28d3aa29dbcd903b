"""Pure translations of the cluster's own objects (KubeRay pods, RayClusters): no I/O."""
