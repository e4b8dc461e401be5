// fake-dra-driver: a DRA kubelet plugin for the test suite's real node, built on
// k8s.io/dynamic-resource-allocation/kubeletplugin. It publishes the fake GPUs as NVIDIA's
// DRA driver publishes real ones: driver gpu.nvidia.com, one pool named after the node,
// whole GPUs as devices gpu-<minor> with the attributes uuid and
// resource.kubernetes.io/pciBusID. Claims are prepared with CDI: at start it writes one
// CDI spec (kind k8s.gpu.nvidia.com/device, a device gpu-<minor> per GPU) that injects
// /dev/nvidia<minor> (the char node 195:<minor> under the test's dev root) and
// NVIDIA_VISIBLE_DEVICES=<uuid>, and answers NodePrepareResources with those CDI ids.
// Test infrastructure only.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const (
	driverName = "gpu.nvidia.com"
	// The CDI kind NVIDIA's DRA driver uses for its claims' devices.
	cdiKind = "k8s.gpu.nvidia.com/device"
)

type gpu struct {
	uuid, minor, bus string
}

func (g gpu) device() string { return "gpu-" + g.minor }

type driver struct {
	gpus []gpu
	pool string
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var res kubeletplugin.PrepareResult
		if claim.Status.Allocation == nil {
			res.Err = fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
			out[claim.UID] = res
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != driverName {
				continue
			}
			if !d.has(r.Device) || r.Pool != d.pool {
				res.Err = fmt.Errorf("claim %s/%s: no device %s/%s here", claim.Namespace, claim.Name, r.Pool, r.Device)
				break
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{cdiKind + "=" + r.Device},
			})
		}
		klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(claim), "devices", res.Devices, "err", res.Err)
		out[claim.UID] = res
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *driver) has(device string) bool {
	for _, g := range d.gpus {
		if g.device() == device {
			return true
		}
	}
	return false
}

func (d *driver) resources() resourceslice.DriverResources {
	var devices []resourceapi.Device
	for _, g := range d.gpus {
		devices = append(devices, resourceapi.Device{
			Name: g.device(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":                            {StringValue: ptr.To(g.uuid)},
				"type":                            {StringValue: ptr.To("gpu")},
				"minor":                           {IntValue: ptr.To(int64(atoi(g.minor)))},
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(g.bus)},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.pool: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// writeCDISpec writes the CDI spec of every GPU into dir, atomically.
func writeCDISpec(dir, devRoot string, gpus []gpu) error {
	type node struct {
		Path        string `json:"path"`
		HostPath    string `json:"hostPath"`
		Permissions string `json:"permissions"`
	}
	type edits struct {
		Env         []string `json:"env"`
		DeviceNodes []node   `json:"deviceNodes"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		CDIVersion string   `json:"cdiVersion"`
		Kind       string   `json:"kind"`
		Devices    []device `json:"devices"`
	}{CDIVersion: "0.6.0", Kind: cdiKind}
	for _, g := range gpus {
		spec.Devices = append(spec.Devices, device{
			Name: g.device(),
			ContainerEdits: edits{
				Env: []string{"NVIDIA_VISIBLE_DEVICES=" + g.uuid},
				DeviceNodes: []node{{
					Path:        "/dev/nvidia" + g.minor,
					HostPath:    filepath.Join(devRoot, "nvidia"+g.minor),
					Permissions: "rw",
				}},
			},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "k8s.gpu.nvidia.com-fake.json")
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig to publish ResourceSlices with")
	nodeName := flag.String("node-name", "", "the node's name (and the pool's)")
	registrarDir := flag.String("registrar-dir", kubeletplugin.KubeletRegistryDir, "kubelet's plugin registration directory")
	pluginDir := flag.String("plugin-dir", filepath.Join(kubeletplugin.KubeletPluginsDir, driverName), "the driver's data directory (dra.sock)")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the runtime reads CDI specs")
	devRoot := flag.String("dev-root", "/dev", "where the /dev/nvidiaN nodes are on the host")
	gpus := flag.String("gpus", "", "UUID=MINOR=PCIBUSID,... for each GPU")
	flag.Parse()
	d := &driver{pool: *nodeName}
	for _, kv := range strings.Split(*gpus, ",") {
		f := strings.Split(kv, "=")
		if len(f) != 3 {
			klog.Fatalf("--gpus: %q is not UUID=MINOR=PCIBUSID", kv)
		}
		d.gpus = append(d.gpus, gpu{uuid: f[0], minor: f[1], bus: f[2]})
	}
	if err := writeCDISpec(*cdiDir, *devRoot, d.gpus); err != nil {
		klog.Fatalf("CDI spec: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	for _, dir := range []string{*registrarDir, *pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			klog.Fatalf("%s: %v", dir, err)
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
		kubeletplugin.HealthService(false),
		kubeletplugin.GRPCVerbosity(2),
	)
	if err != nil {
		klog.Fatalf("start: %v", err)
	}
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		klog.Fatalf("publish: %v", err)
	}
	klog.Infof("serving %s: pool %s, %d GPUs", driverName, d.pool, len(d.gpus))
	<-ctx.Done()
	helper.Stop()
}
