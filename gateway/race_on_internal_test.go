//go:build race

package gateway

// raceEnabled: built with -race (TestFanoutSameBytesAsGRPCPath skips its
// SSE comparison, whose old path swaps s.gwMux under the running server).
const raceEnabled = true
