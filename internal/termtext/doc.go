// Package termtext makes text that others chose (clients, guests,
// hypervisors) safe to print on an operator's terminal, for every text
// renderer of the provider (the plan and the history).
package termtext
