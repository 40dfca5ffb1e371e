package planschema

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// HistoryPath is the published history schema's location.
func HistoryPath() string {
	return filepath.Join(filepath.Dir(Path()), "history.schema.json")
}

var (
	historyOnce     sync.Once
	historyCompiled *jsonschema.Schema
	historyErr      error
)

// ValidateHistory reports whether raw is a valid JSON history of the
// published schema (docs/history.schema.json), every violation in the
// error.
func ValidateHistory(raw []byte) error {
	historyOnce.Do(func() {
		f, err := os.Open(HistoryPath())
		if err != nil {
			historyErr = err
			return
		}
		defer f.Close()
		doc, err := jsonschema.UnmarshalJSON(f)
		if err != nil {
			historyErr = fmt.Errorf("parse %s: %w", HistoryPath(), err)
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource("history.schema.json", doc); err != nil {
			historyErr = err
			return
		}
		historyCompiled, historyErr = c.Compile("history.schema.json")
	})
	if historyErr != nil {
		return fmt.Errorf("load history schema: %w", historyErr)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("history is not JSON: %w", err)
	}
	return historyCompiled.Validate(inst)
}
