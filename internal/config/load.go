package config

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// A Checker parses what Load only reads — a verification policy's keys,
// certificates and trusted root — in the package that links the parsers
// (internal/verify.CheckTrust), so that config, and the engine that reads
// it, links no crypto. It reports each problem at its field with report
// (plain is the field's path, verification[0].cosign.publicKeys[1]; named
// the same with the policy's name, PolicyPath); Load gives it a line and
// returns it with every other problem of the file.
type Checker func(c *Config, report func(named, plain, msg string))

// Load reads the config file at path. On top of Parse it checks that every
// caFile is a readable PEM bundle, so that a TLS misconfiguration fails at
// start-up and not at the first registry call, and it reads every
// verification policy's public keys, certificates and trusted root (V1),
// which the checks parse.
func Load(path string, checks ...Checker) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, lines, errs := parse(data)
	if c != nil {
		for i, r := range c.Registries {
			if r.CAFile == "" {
				continue
			}
			p := fmt.Sprintf("registries[%d].caFile", i)
			if msg := checkCAFile(r.CAFile); msg != "" {
				errs = append(errs, &FieldError{Path: p, Line: lineOf(lines, p), Msg: msg})
			}
		}
		errs = append(errs, c.loadKeys(lines)...)
		errs = append(errs, c.loadPromotion(lines)...)
		if len(errs) == 0 {
			for _, check := range checks {
				check(c, func(named, plain, msg string) {
					errs = append(errs, &FieldError{Path: named, Line: lineOf(lines, plain), Msg: msg})
				})
			}
		}
	}
	if len(errs) > 0 {
		return nil, wrap(path, errs)
	}
	return c, nil
}

func checkCAFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("cannot read CA bundle: %v", err)
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			return "" // the registry client parses the bundle when it starts
		}
	}
	return fmt.Sprintf("%s holds no PEM certificate", path)
}

// Parse decodes a config file strictly, applies the defaults and validates
// the result. source names the file in messages. It has no filesystem
// access, so it does not check caFile nor read public keys; use Load for a
// file on disk.
func Parse(data []byte, source string) (*Config, error) {
	c, _, errs := parse(data)
	if len(errs) > 0 {
		return nil, wrap(source, errs)
	}
	return c, nil
}

// parse returns the config (nil when the file is not a YAML mapping at all),
// the line of each field path, and every problem found.
func parse(data []byte) (*Config, map[string]int, []error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, []error{&FieldError{Msg: "config is empty"}}
		}
		return nil, nil, []error{&FieldError{Msg: fmt.Sprintf("invalid YAML: %v", err)}}
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		msg := "multiple YAML documents: the config is one document"
		if err != nil {
			msg = fmt.Sprintf("invalid YAML after the first document: %v", err)
		}
		return nil, nil, []error{&FieldError{Line: next.Line, Msg: msg}}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if isNull(root) {
		return nil, nil, []error{&FieldError{Msg: "config is empty"}}
	}
	if root.Kind != yaml.MappingNode {
		return nil, nil, []error{&FieldError{Line: root.Line, Msg: "the config must be a YAML mapping, got " + describe(root)}}
	}
	c := Defaults()
	d := decode(data, root, c)
	errs := append(d.errs, c.validate(d.lines, d.failed)...)
	return c, d.lines, errs
}
