package desired

// recordSteps records the steps of a libvirt Create, as the executor does.
func recordSteps(d *Document, id, op string) {
	for _, a := range []string{"create-overlay", "create-seed", "define", "start", "autostart", "wait-agent"} {
		d.Record(id, Event{Kind: EventStep, OpID: op, Action: a, Reason: "intent:create", DurationMS: 300, Outcome: "ok"})
	}
}
