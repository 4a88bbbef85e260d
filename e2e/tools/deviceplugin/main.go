// gpuqueue-fake-deviceplugin advertises fake GPUs to a real kubelet over the device-plugin
// gRPC API (v1beta1), so the kubelet's device manager allocates and frees them as it would
// NVIDIA's: the end-to-end tests' real node has no GPU.
//
// Each Allocate is logged as one line, "allocate <resource> <ids>", so a test can see which
// fake device a container got. The plugin re-registers when the kubelet restarts (a kubelet
// removes every socket in its device-plugin directory on start).
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

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	devices  []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once: fake devices never change health.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// Allocate hands the IDs to the container as NVIDIA's plugin does, in NVIDIA_VISIBLE_DEVICES.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := strings.Join(c.DevicesIds, ",")
		log.Printf("allocate %s %s", p.resource, ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// serve listens on dir/name and registers with the kubelet's socket in dir; it returns the
// server once the kubelet has accepted the registration.
func (p *plugin) serve(dir, name string) (*grpc.Server, error) {
	sock := filepath.Join(dir, name)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     name,
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("register %s with the kubelet in %s: %w", p.resource, dir, err)
	}
	log.Printf("registered %s with %d devices at %s", p.resource, len(p.devices), sock)
	return srv, nil
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource to advertise")
	count := flag.Int("count", 8, "number of fake devices")
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	name := flag.String("socket", "gpuqueue-fake-gpu.sock", "this plugin's socket name in -dir")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	p := &plugin{resource: *resource}
	for i := range *count {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("fake-gpu-%d", i), Health: pluginapi.Healthy})
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	var srv *grpc.Server
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// (Re)register whenever our socket is gone: the kubelet is new, or not up yet.
		if _, err := os.Stat(filepath.Join(*dir, *name)); srv == nil || err != nil {
			if srv != nil {
				srv.Stop()
				srv = nil
			}
			s, err := p.serve(*dir, *name)
			if err != nil {
				log.Printf("not registered yet: %v", err)
			}
			srv = s
		}
		select {
		case <-stop:
			if srv != nil {
				srv.Stop()
			}
			return
		case <-tick.C:
		}
	}
}
