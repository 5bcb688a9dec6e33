package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/pipestream/gateway/internal/conformance"
)

const conformanceHelp = `Usage: gateway conformance serve|send [flags]

Stand in the PipeStream reference suite's Layer 0 interop matrix
(ai-pipestream/pipestream-quic-protocol-rfc, conformance/README.md, "Standalone
command contract"): one entity per QUIC connection, the reference's draft-04
conversation.

  gateway conformance serve --bind HOST:PORT --cert SERVER_CERT --key SERVER_KEY \
    --output-dir DIRECTORY --ready-file FILE [--once]
  gateway conformance send --connect HOST:PORT --ca CA_CERT --server-name DNS_NAME \
    --entity-id ID [--parent-id ID] --input FILE [--content-type MEDIA_TYPE]

serve writes DIRECTORY/ID.bin only after the whole entity stream was verified
(payload-length and SHA-256), and DIRECTORY/ID.parent ("PARENT\n") when the
entity has a parent-id; FILE receives the bound "HOST:PORT\n" once the server
listens. Exit status: 0 success, 1 refused or failed conversation (the error on
stderr names the PipeStream error), 2 bad flags.

Example (a send against a serve; certificates as the reference's driver makes them):
  gateway conformance serve --cert server.crt --key server.key --output-dir got --ready-file ready --once &
  until [ -s ready ]; do sleep 0.1; done
  gateway conformance send --connect "$(cat ready)" --ca ca.crt --server-name localhost \
    --entity-id 100 --parent-id 42 --input payload.bin

Run 'gateway conformance serve --help' or 'gateway conformance send --help'.`

func runConformance(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "gateway conformance: want a subcommand, serve or send (see 'gateway conformance --help')")
		return 2
	}
	switch args[0] {
	case "serve":
		return runConformanceServe(args[1:])
	case "send":
		return runConformanceSend(args[1:])
	case "-h", "--help", "-help", "help":
		fmt.Println(conformanceHelp)
		return 0
	}
	fmt.Fprintf(os.Stderr, "gateway conformance: unknown subcommand %q: want serve or send\n", args[0])
	return 2
}

func runConformanceServe(args []string) int {
	fs := newFlags("conformance serve", "gateway conformance serve [flags]", `Receive entities with the reference server conversation, one connection at a
time, and store each as OUTPUT-DIR/ID.bin (+ ID.parent). With --once, exit after
the first connection: 0 when its entity was stored and the conversation
completed, 1 otherwise. Without it, serve until SIGINT/SIGTERM (exit 0);
refused connections are logged to stderr. Prints "READY HOST:PORT" and
"RECEIVED ID LENGTH" on stdout, as the reference does.

Example:
  gateway conformance serve --bind 127.0.0.1:0 --cert server.crt --key server.key \
    --output-dir received --ready-file ready --once`)
	bind := fs.String("bind", "GATEWAY_CONFORMANCE_BIND", "127.0.0.1:0", "UDP listen address (port 0: a free port, written to --ready-file)")
	cert := fs.String("cert", "GATEWAY_CONFORMANCE_CERT", "", "PEM server certificate (chain) file")
	key := fs.String("key", "GATEWAY_CONFORMANCE_KEY", "", "PEM private key file")
	out := fs.String("output-dir", "GATEWAY_CONFORMANCE_OUTPUT_DIR", "", "directory for ID.bin and ID.parent (created if absent)")
	ready := fs.String("ready-file", "GATEWAY_CONFORMANCE_READY_FILE", "", "file that receives \"HOST:PORT\\n\" once the server listens")
	once := fs.Bool("once", "GATEWAY_CONFORMANCE_ONCE", false, "exit after the first connection, with its outcome")
	maxPayload := fs.Int64("max-payload", "GATEWAY_CONFORMANCE_MAX_PAYLOAD", conformance.DefaultMaxPayload, "largest entity payload accepted; a larger payload-length is refused (0x06) before it is read")
	timeout := fs.Duration("timeout", "GATEWAY_CONFORMANCE_TIMEOUT", conformance.DefaultTimeout, "bound on one connection's conversation")
	logLevel := fs.String("log-level", "GATEWAY_LOG_LEVEL", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "GATEWAY_LOG_FORMAT", "text", "text or json")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if code, ok := noArgs(fs); !ok {
		return code
	}
	if *cert == "" || *key == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "gateway conformance serve: --cert, --key and --output-dir are required (see --help)")
		return 2
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return fail(os.Stderr, "conformance serve", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = conformance.Serve(ctx, conformance.ServeOptions{
		Bind: *bind, CertFile: *cert, KeyFile: *key, OutputDir: *out, ReadyFile: *ready, Once: *once,
		MaxPayload: *maxPayload, Timeout: *timeout, Stdout: os.Stdout, Log: log,
	})
	if err != nil {
		return fail(os.Stderr, "conformance serve", err)
	}
	return 0
}

func runConformanceSend(args []string) int {
	fs := newFlags("conformance send", "gateway conformance send [flags]", `Send one file as one entity with the reference client conversation and wait
for the server's PROCESSING and COMPLETE, the CHECKPOINT acknowledgement and the
GOAWAY echo. Exit 0 on success (prints "SENT ID LENGTH"), 1 when the server
refuses or the conversation fails, 2 on bad flags.

Example:
  gateway conformance send --connect 127.0.0.1:4433 --ca ca.crt --server-name localhost \
    --entity-id 100 --parent-id 42 --input payload.bin`)
	connect := fs.String("connect", "GATEWAY_CONFORMANCE_CONNECT", "", "server UDP address HOST:PORT")
	ca := fs.String("ca", "GATEWAY_CONFORMANCE_CA", "", "PEM CA certificate that verifies the server")
	serverName := fs.String("server-name", "GATEWAY_CONFORMANCE_SERVER_NAME", "localhost", "TLS server name the certificate must carry")
	entityID := fs.String("entity-id", "GATEWAY_CONFORMANCE_ENTITY_ID", "", "entity ID, 1..4294967292")
	parentID := fs.String("parent-id", "GATEWAY_CONFORMANCE_PARENT_ID", "", "parent-id to put in the entity header (optional)")
	input := fs.String("input", "GATEWAY_CONFORMANCE_INPUT", "", "file whose bytes are the entity payload")
	contentType := fs.String("content-type", "GATEWAY_CONFORMANCE_CONTENT_TYPE", "application/octet-stream", "content-type of the entity")
	maxPayload := fs.Int64("max-payload", "GATEWAY_CONFORMANCE_MAX_PAYLOAD", conformance.DefaultMaxPayload, "refuse a larger --input before connecting")
	timeout := fs.Duration("timeout", "GATEWAY_CONFORMANCE_TIMEOUT", conformance.DefaultTimeout, "bound on the whole conversation")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if code, ok := noArgs(fs); !ok {
		return code
	}
	o := conformance.SendOptions{Connect: *connect, CAFile: *ca, ServerName: *serverName, InputFile: *input,
		ContentType: *contentType, MaxPayload: *maxPayload, Timeout: *timeout, Stdout: os.Stdout}
	var err error
	if o.EntityID, err = parseEntityID("--entity-id", *entityID); err == nil && *parentID != "" {
		var p uint32
		p, err = parseEntityID("--parent-id", *parentID)
		o.ParentID = &p
	}
	if err == nil && (*connect == "" || *ca == "" || *input == "") {
		err = fmt.Errorf("--connect, --ca, --entity-id and --input are required (see --help)")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway conformance send: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := conformance.Send(ctx, o); err != nil {
		return fail(os.Stderr, "conformance send", err)
	}
	return 0
}

// parseEntityID reads an entity ID: 1..0xFFFFFFFC (0 and the top three
// values are reserved).
func parseEntityID(flag, s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 || n > 0xFFFFFFFC {
		return 0, fmt.Errorf("%s %q: want an entity ID 1..4294967292", flag, s)
	}
	return uint32(n), nil
}

func noArgs(fs *flagSet) (int, bool) {
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway %s: unexpected argument %q (flags only; see --help)\n", fs.Name(), fs.Arg(0))
		return 2, false
	}
	return 0, true
}
