package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// The configuration file's sections. Each service reads its own and
// common; `converge dev` and `converge demo` read dev; every other
// `converge` command reads cli.
const (
	SectionCommon = "common"
	SectionDev    = "dev"
	SectionCLI    = "cli"
	// SectionSources holds the mappings of tables to documents that
	// `converge source apply` installs (package source): not settings
	// of a command, but a mapping of source names to their mappings.
	SectionSources = "sources"
)

// Sections are the configuration file's sections, in the order a file
// lists them.
var Sections = []string{SectionCommon, "writer", "relay", "projector-index", "projector-graph", "notifier", SectionDev, SectionCLI}

// SectionOf is the section a command named name reads: a service's own
// name ("relay", or "converge relay" run as a subcommand), dev for
// `converge dev` and `converge demo`, cli for the other `converge`
// commands; a name of none of these is its own section.
func SectionOf(name string) string {
	sub, isCLI := strings.CutPrefix(name, "converge ")
	first, _, _ := strings.Cut(sub, " ")
	switch {
	case slices.Contains(Sections, first) && first != SectionCommon && first != SectionCLI:
		return first
	case first == "demo":
		return SectionDev
	case isCLI:
		return SectionCLI
	}
	return name
}

// File is a deployment's configuration file: YAML, one mapping per
// section, whose keys are the flags' names without the dash and whose
// values are single values, as the flags take them:
//
//	common:
//	  nats-url: nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222
//	  replicas: 3
//	relay:
//	  postgres-url: postgres://converge_relay@db/converge
//	  window: 8192
//	projector-index:
//	  qdrant-url: qdrant:6334
//
// A command takes from its section, else from common, each setting that
// neither its command line nor its environment gives. A key the command's
// own section names that is not one of its flags is an error; common's
// keys are given to the commands that have them. Secrets are better left
// out: give them as variables or files (X_FILE, the flags ending in
// -file), which the file can name.
type File struct {
	Path     string
	sections map[string][]entry
	sources  *yaml.Node
}

// Sources is the file's sources section (nil when it has none), for
// package source to read.
func (f *File) Sources() *yaml.Node { return f.sources }

type entry struct {
	key, value string
	line       int
}

// ReadFile reads and checks the configuration file at path: a mapping of
// known sections to mappings of single values.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: -config: %w", err)
	}
	return ParseFile(path, b)
}

// ParseFile parses a configuration file's contents; path names it in
// errors.
func ParseFile(path string, b []byte) (*File, error) {
	f := &File{Path: path, sections: map[string][]entry{}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return f, nil // an empty file
		}
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return f, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s:%d: expected a mapping of sections (%s)", path, root.Line, strings.Join(Sections, ", "))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value == SectionSources {
			if f.sources != nil {
				return nil, fmt.Errorf("config file %s:%d: section %s given twice", path, k.Line, k.Value)
			}
			f.sources = v
			continue
		}
		if !slices.Contains(Sections, k.Value) {
			return nil, fmt.Errorf("config file %s:%d: unknown section %q (the sections: %s, %s)", path, k.Line, k.Value, strings.Join(Sections, ", "), SectionSources)
		}
		if _, dup := f.sections[k.Value]; dup {
			return nil, fmt.Errorf("config file %s:%d: section %s given twice", path, k.Line, k.Value)
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			f.sections[k.Value] = nil
			continue
		}
		if v.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("config file %s:%d: section %s must be a mapping of settings", path, v.Line, k.Value)
		}
		seen := map[string]bool{}
		for j := 0; j+1 < len(v.Content); j += 2 {
			sk, sv := v.Content[j], v.Content[j+1]
			name := strings.TrimPrefix(sk.Value, "-")
			if seen[name] {
				return nil, fmt.Errorf("config file %s:%d: %s.%s given twice", path, sk.Line, k.Value, name)
			}
			seen[name] = true
			if sv.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("config file %s:%d: %s.%s must be a single value (a list is written as the flag takes it, e.g. comma-separated)", path, sv.Line, k.Value, name)
			}
			value := sv.Value
			if sv.Tag == "!!null" {
				value = ""
			}
			f.sections[k.Value] = append(f.sections[k.Value], entry{key: name, value: value, line: sk.Line})
		}
	}
	return f, nil
}

// Keys returns the keys of section, in the file's order.
func (f *File) Keys(section string) []string {
	var keys []string
	for _, e := range f.sections[section] {
		keys = append(keys, e.key)
	}
	return keys
}

// Check reports the keys of the file that no command reading their
// section has: known maps each section to the flags of the commands that
// read it. common's keys must be known to at least one section.
func (f *File) Check(known map[string][]string) error {
	var all []string
	for _, names := range known {
		all = append(all, names...)
	}
	var errs []error
	for _, section := range Sections {
		for _, e := range f.sections[section] {
			names := known[section]
			if section == SectionCommon {
				names = all
			}
			if !slices.Contains(names, e.key) || e.key == "config" {
				errs = append(errs, fmt.Errorf("config file %s:%d: %s.%s is not a setting of %s", f.Path, e.line, section, e.key, sectionWho(section)))
			}
		}
	}
	return errors.Join(errs...)
}

func sectionWho(section string) string {
	switch section {
	case SectionCommon:
		return "any command"
	case SectionDev:
		return "converge dev"
	case SectionCLI:
		return "any converge command"
	}
	return section
}

// apply sets, from the file, each flag that neither the command line nor
// its variable gave: common's first, then the command's own section's.
func (f *Flags) apply(file *File) error {
	given := map[string]bool{}
	f.FlagSet.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	for _, section := range []string{SectionCommon, f.section} {
		for _, e := range file.sections[section] {
			fl := f.FlagSet.Lookup(e.key)
			switch {
			case e.key == "config" || e.key == "version":
				return fmt.Errorf("config file %s:%d: %s.%s cannot be set in the file", file.Path, e.line, section, e.key)
			case fl == nil && section == SectionCommon, fl == nil && section == SectionCLI:
				continue // another command's setting
			case fl == nil:
				return fmt.Errorf("config file %s:%d: %s.%s is not a setting of %s (-h lists them)", file.Path, e.line, section, e.key, f.Name())
			case given[e.key] || f.envSet[e.key]:
				continue
			}
			if err := f.FlagSet.Set(e.key, e.value); err != nil {
				// Only a flag that parses its value fails here (a
				// number, a duration, a boolean), never a string one: the
				// value may be quoted, no secret is.
				return fmt.Errorf("config file %s:%d: %s.%s: invalid value %q: %w", file.Path, e.line, section, e.key, e.value, err)
			}
		}
	}
	return nil
}
