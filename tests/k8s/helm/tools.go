//go:build tools

// The command built from this module; `go mod tidy` keeps go.sum to it.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
