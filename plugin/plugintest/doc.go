// Package plugintest resolves one hypervisor plug-in's flags on their own,
// for the plug-ins' tests: what config does for a whole command line,
// with every problem recorded as a line.
package plugintest
