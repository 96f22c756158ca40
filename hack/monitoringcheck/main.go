// Command monitoringcheck decodes every ServiceMonitor and PrometheusRule
// in rendered manifests (files named as arguments, or standard input)
// strictly into prometheus-operator's own monitoring.coreos.com/v1 Go
// types: an unknown or misspelt field, or a value of the wrong type, is an
// error. It prints one line per object checked and exits 1 on the first
// problem. test/e2e/chart's tests build it (go build in this folder, its
// own module, so the operator's API module stays out of image-refresh's
// go.mod) and run it on the chart's output.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	var inputs [][]byte
	if len(os.Args) < 2 {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail(err)
		}
		inputs = append(inputs, b)
	}
	for _, name := range os.Args[1:] {
		b, err := os.ReadFile(name)
		if err != nil {
			fail(err)
		}
		inputs = append(inputs, b)
	}
	n := 0
	for _, in := range inputs {
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(in), -1) {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				fail(fmt.Errorf("a document does not parse: %w\n%s", err, doc))
			}
			var obj any
			switch meta.Kind {
			case monitoringv1.ServiceMonitorsKind:
				obj = &monitoringv1.ServiceMonitor{}
			case monitoringv1.PrometheusRuleKind:
				obj = &monitoringv1.PrometheusRule{}
			default:
				continue
			}
			if err := strict([]byte(doc), obj); err != nil {
				fail(fmt.Errorf("%s %s: %w", meta.Kind, meta.Metadata.Name, err))
			}
			fmt.Printf("ok %s %s\n", meta.Kind, meta.Metadata.Name)
			n++
		}
	}
	if n == 0 {
		fail(errors.New("no ServiceMonitor or PrometheusRule in the input"))
	}
}

// strict decodes YAML into obj, refusing unknown fields.
func strict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	return dec.Decode(obj)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "monitoringcheck:", err)
	os.Exit(1)
}
