package planschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Path is the published schema's location in the repository.
func Path() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "plan.schema.json")
}

var (
	once     sync.Once
	compiled *jsonschema.Schema
	errLoad  error
)

func schema() (*jsonschema.Schema, error) {
	once.Do(func() {
		f, err := os.Open(Path())
		if err != nil {
			errLoad = err
			return
		}
		defer f.Close()
		doc, err := jsonschema.UnmarshalJSON(f)
		if err != nil {
			errLoad = fmt.Errorf("parse %s: %w", Path(), err)
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource("plan.schema.json", doc); err != nil {
			errLoad = err
			return
		}
		compiled, errLoad = c.Compile("plan.schema.json")
	})
	return compiled, errLoad
}

// Validate reports whether planJSON is a valid plan of the published
// schema, with every violation in the error.
func Validate(planJSON []byte) error {
	sch, err := schema()
	if err != nil {
		return fmt.Errorf("load plan schema: %w", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(planJSON))
	if err != nil {
		return fmt.Errorf("plan is not JSON: %w", err)
	}
	return sch.Validate(inst)
}

// Raw returns the schema document itself, decoded.
func Raw() (map[string]any, error) {
	b, err := os.ReadFile(Path())
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}
