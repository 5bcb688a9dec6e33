// Package e2e holds the end-to-end tests of the gateway: they build the
// gateway binary, start it (and, for the external-peer mode, a standalone
// `gateway peer`) as real processes with temporary data directories and free
// loopback ports, and talk to them only over the network with real clients:
// curl, grpcurl, a Go gRPC client built from gen/, the gateway's own client
// verbs, and headless Chromium for /docs/.
//
// The package imports nothing of the project but gen/ (docs/architecture.md, "Layers",
// enforced by internal/archtest). See README.md for the tools it needs.
package e2e
