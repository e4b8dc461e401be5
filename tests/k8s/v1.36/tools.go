//go:build tools

// The commands this release's node runs; `go mod tidy` keeps go.sum to them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
	// etcd at the version this release pins (v3.6.8).
	_ "go.etcd.io/etcd/server/v3"
)
