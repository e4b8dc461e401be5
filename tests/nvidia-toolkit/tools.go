//go:build tools

// The toolkit's commands the tests run; `go mod tidy` keeps go.sum to them.
package tools

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
)
