// fake-gpu-plugin: a kubelet device plugin for the test suite's real node. It advertises
// the fake GPUs as NVIDIA's device plugin advertises real ones (resource nvidia.com/gpu,
// one device per GPU named by its UUID) and answers Allocate as that plugin does in its
// default mode: the /dev/nvidiaN node of each GPU and NVIDIA_VISIBLE_DEVICES naming them.
// The nodes are char nodes 195:N under the test's dev root. Test infrastructure only.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type gpu struct {
	uuid  string
	minor string
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	gpus    []gpu
	devRoot string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	var devs []*pluginapi.Device
	for _, g := range p.gpus {
		devs = append(devs, &pluginapi.Device{ID: g.uuid, Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{
			"NVIDIA_VISIBLE_DEVICES": strings.Join(cr.DevicesIds, ","),
		}}
		for _, id := range cr.DevicesIds {
			g, ok := p.byUUID(id)
			if !ok {
				return nil, fmt.Errorf("no GPU %q", id)
			}
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{
				ContainerPath: "/dev/nvidia" + g.minor,
				HostPath:      filepath.Join(p.devRoot, "nvidia"+g.minor),
				Permissions:   "rw",
			})
		}
		out.ContainerResponses = append(out.ContainerResponses, resp)
	}
	return out, nil
}

func (p *plugin) byUUID(id string) (gpu, bool) {
	for _, g := range p.gpus {
		if g.uuid == id {
			return g, true
		}
	}
	return gpu{}, false
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	pluginDir := flag.String("plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet's device-plugins directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource")
	devRoot := flag.String("dev-root", "/dev", "where the /dev/nvidiaN nodes are on the host")
	gpus := flag.String("gpus", "", "UUID=MINOR,... for each GPU")
	flag.Parse()
	p := &plugin{devRoot: *devRoot}
	for _, kv := range strings.Split(*gpus, ",") {
		uuid, minor, ok := strings.Cut(kv, "=")
		if !ok {
			log.Fatalf("--gpus: %q is not UUID=MINOR", kv)
		}
		p.gpus = append(p.gpus, gpu{uuid: uuid, minor: minor})
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As NVIDIA's plugin does: serve once kubelet's socket is there, and serve and
	// register again whenever kubelet starts anew (it removes every other socket in the
	// directory when it starts).
	var srv *grpc.Server
	var kubeletSock os.FileInfo
	for {
		select {
		case <-sig:
			if srv != nil {
				srv.Stop()
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
		fi, err := os.Stat(filepath.Join(*pluginDir, "kubelet.sock"))
		if err != nil || (kubeletSock != nil && os.SameFile(fi, kubeletSock) && exists(*pluginDir)) {
			continue
		}
		if srv != nil {
			srv.Stop()
		}
		srv, err = serve(*pluginDir, p)
		if err != nil {
			log.Fatal(err)
		}
		if err := registerOnce(*pluginDir, *resource); err != nil {
			log.Printf("register: %v", err)
			continue
		}
		kubeletSock = fi
		log.Printf("registered %s: %d GPUs", *resource, len(p.gpus))
	}
}

func exists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "fake-gpu.sock"))
	return err == nil
}

func serve(dir string, p *plugin) (*grpc.Server, error) {
	sock := filepath.Join(dir, "fake-gpu.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}

// registerOnce tells kubelet about the plugin.
func registerOnce(dir, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     "fake-gpu.sock",
		ResourceName: resource,
	})
	return err
}
