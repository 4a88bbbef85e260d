// Command gpuqueue-flux-health tells the health Flux's kustomize-controller gives an object,
// with the same code: kstatus (github.com/fluxcd/cli-utils) when no CEL health check covers its
// kind, and the status reader of `spec.healthCheckExprs` (github.com/fluxcd/pkg/runtime/cel)
// when one does.
//
// Usage:
//
//	gpuqueue-flux-health kstatus OBJECT.yaml
//	gpuqueue-flux-health cel CHECKS.yaml OBJECT.yaml
//
// CHECKS.yaml holds a Kustomization's `healthCheckExprs:` as a map with that one key; an object
// is YAML or JSON. Both print {"status":...,"message":...}, the status as Flux names it
// (Current, InProgress, Failed...); an expression that cannot be evaluated on the object exits 1
// with Flux's error.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	var result health
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "kstatus":
		result, err = kstatusOf(os.Args[2])
	case len(os.Args) == 4 && os.Args[1] == "cel":
		result, err = celHealthOf(os.Args[2], os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: gpuqueue-flux-health kstatus OBJECT.yaml | cel CHECKS.yaml OBJECT.yaml")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}

func readObject(path string) (*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	asJSON, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// As the API machinery decodes it: whole numbers as int64, which kstatus requires.
	object := &unstructured.Unstructured{}
	if err := object.UnmarshalJSON(asJSON); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return object, nil
}

func kstatusOf(objectPath string) (health, error) {
	object, err := readObject(objectPath)
	if err != nil {
		return health{}, err
	}
	result, err := status.Compute(object)
	if err != nil {
		return health{}, err
	}
	return health{Status: result.Status.String(), Message: result.Message}, nil
}

func celHealthOf(checksPath, objectPath string) (health, error) {
	raw, err := os.ReadFile(checksPath)
	if err != nil {
		return health{}, err
	}
	var checks struct {
		HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
	}
	if err := yaml.UnmarshalStrict(raw, &checks); err != nil {
		return health{}, fmt.Errorf("%s: %w", checksPath, err)
	}
	reader, err := cel.NewStatusReader(checks.HealthCheckExprs)
	if err != nil {
		return health{}, fmt.Errorf("%s: %w", checksPath, err)
	}
	object, err := readObject(objectPath)
	if err != nil {
		return health{}, err
	}
	// The generic reader computes an object's status from the object alone: no cluster, no
	// REST mapping needed.
	result, err := reader(nil).ReadStatusForObject(context.Background(), nil, object)
	if err != nil {
		return health{}, err
	}
	if result.Error != nil {
		return health{}, result.Error
	}
	return health{Status: result.Status.String(), Message: result.Message}, nil
}
