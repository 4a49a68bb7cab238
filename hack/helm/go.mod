// Wrapper module: builds helm from helm.sh/helm/v4 v4.3.2.
// Versions are pinned in ../versions.env; see ../build-k8s.sh.
module pdpair.local/hack/helm

go 1.26.0

require helm.sh/helm/v4 v4.3.2

tool helm.sh/helm/v4/cmd/helm
