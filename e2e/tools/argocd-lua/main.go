// Command gpuqueue-argocd-lua runs an Argo CD health-check script the way Argo CD's
// application controller does (argo-cd util/lua): gopher-lua (Lua 5.1) with only the package,
// base and table libraries open, a one-second deadline, the object as the global `obj`
// (JSON numbers as Lua numbers), and the returned table's `status` and `message` read back.
//
// Usage:
//
//	gpuqueue-argocd-lua test DIR     runs DIR/health.lua on every case of DIR/health_test.yaml
//	gpuqueue-argocd-lua health SCRIPT OBJECT.yaml
//	                                  prints {"status":...,"message":...} for one object
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type healthTests struct {
	Tests []struct {
		HealthStatus healthStatus `json:"healthStatus"`
		InputPath    string       `json:"inputPath"`
	} `json:"tests"`
}

// The statuses Argo CD accepts from a health script.
var knownStatuses = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true,
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "test" {
		os.Exit(runTests(os.Args[2]))
	}
	if len(os.Args) == 4 && os.Args[1] == "health" {
		status, err := healthOfFile(os.Args[2], os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out, _ := json.Marshal(status)
		fmt.Println(string(out))
		return
	}
	fmt.Fprintln(os.Stderr, "usage: gpuqueue-argocd-lua test DIR | health SCRIPT OBJECT.yaml")
	os.Exit(2)
}

func runTests(dir string) int {
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var tests healthTests
	if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
		fmt.Fprintf(os.Stderr, "%s/health_test.yaml: %v\n", dir, err)
		return 1
	}
	passed, failed := 0, 0
	for _, test := range tests.Tests {
		got, err := healthOfFile(filepath.Join(dir, "health.lua"), filepath.Join(dir, test.InputPath))
		switch {
		case err != nil:
			fmt.Printf("FAIL %s: %v\n", test.InputPath, err)
			failed++
		case *got != test.HealthStatus:
			fmt.Printf("FAIL %s: got %+v, want %+v\n", test.InputPath, *got, test.HealthStatus)
			failed++
		default:
			fmt.Printf("ok   %s: %s\n", test.InputPath, got.Status)
			passed++
		}
	}
	if len(tests.Tests) == 0 {
		fmt.Println("FAIL: no tests")
		failed++
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}

func healthOfFile(scriptPath, objectPath string) (*healthStatus, error) {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(objectPath)
	if err != nil {
		return nil, err
	}
	var object map[string]any
	if err := yaml.Unmarshal(raw, &object); err != nil {
		return nil, fmt.Errorf("%s: %w", objectPath, err)
	}
	return health(string(script), object)
}

func health(script string, object map[string]any) (*healthStatus, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for name, open := range map[string]lua.LGFunction{
		lua.LoadLibName: lua.OpenPackage, lua.BaseLibName: lua.OpenBase, lua.TabLibName: lua.OpenTable,
	} {
		l.Push(l.NewFunction(open))
		l.Push(lua.LString(name))
		l.Call(1, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, object))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	table, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	status := &healthStatus{
		Status:  lua.LVAsString(table.RawGetString("status")),
		Message: lua.LVAsString(table.RawGetString("message")),
	}
	if !knownStatuses[status.Status] {
		return nil, fmt.Errorf("the script returned status %q, which Argo CD does not know", status.Status)
	}
	return status, nil
}

// decodeValue turns decoded JSON into Lua values as Argo CD does.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case []any:
		array := l.CreateTable(len(v), 0)
		for _, item := range v {
			array.Append(decodeValue(l, item))
		}
		return array
	case map[string]any:
		table := l.CreateTable(0, len(v))
		for key, item := range v {
			table.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return table
	}
	return lua.LNil
}
