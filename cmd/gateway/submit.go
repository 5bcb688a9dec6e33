package main

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"
	"google.golang.org/protobuf/reflect/protoreflect"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const submitHelp = `Upload FILE (or - for stdin) as a document, streamed over gRPC
UploadDocument in 256 KiB chunks, and print the new document id on stdout.
A progress bar is drawn on stderr when stderr is a terminal (or --progress).

Example:
  id=$(gateway submit --split lines --chunk-bytes 65536 --processor textstats corpus.txt)
  gateway watch "$id"`

func runSubmit(args []string) int {
	fs := newFlags("submit", "gateway submit [flags] FILE", submitHelp)
	cf := addClientFlags(fs)
	split := fs.String("split", "GATEWAY_SPLIT", "", "split strategy: none, fixed_bytes, lines, paragraphs (default: the server's)")
	chunkBytes := fs.Uint("chunk-bytes", "GATEWAY_CHUNK_BYTES", 0, "target chunk size in bytes for --split (0: server default, 1 MiB)")
	maxDepth := fs.Uint("max-depth", "GATEWAY_MAX_DEPTH", 0, "Layer 1 nesting depth the peer may use (0-7)")
	processor := fs.String("processor", "GATEWAY_PROCESSOR", "", "peer processor: passthrough, textstats, sentences, fault")
	contentType := fs.String("content-type", "GATEWAY_CONTENT_TYPE", "", "MIME type (default: from the file extension, else application/octet-stream)")
	requestID := fs.String("request-id", "GATEWAY_REQUEST_ID", "", "idempotency key: resubmitting with the same key returns the first document")
	name := fs.String("name", "GATEWAY_DISPLAY_NAME", "", "display name (default: the file name)")
	showProgress := fs.Bool("progress", "GATEWAY_PROGRESS", false, "draw a progress bar on stderr even when it is not a terminal")
	metadata := map[string]string{}
	fs.FlagSet.Func("metadata", "document metadata KEY=VALUE; repeat for more (e.g. --metadata pipestream.fault=defer)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		metadata[k] = v
		return nil
	})
	if code, ok := fs.parse(args); !ok {
		return code
	}
	path, ok := oneArg(fs, "FILE")
	if !ok {
		return 2
	}

	opts := &gatewayv1.SubmitOptions{ContentType: *contentType, RequestId: *requestID, DisplayName: *name}
	if len(metadata) > 0 {
		opts.Metadata = metadata
	}
	if *split != "" || *chunkBytes != 0 || *maxDepth != 0 || *processor != "" {
		opts.Split = &gatewayv1.SplitOptions{ChunkBytes: uint32(*chunkBytes), MaxDepth: uint32(*maxDepth), Processor: *processor}
		if *split != "" {
			ev := gatewayv1.SplitStrategy(0).Descriptor().Values().ByName(protoreflect.Name("SPLIT_" + strings.ToUpper(*split)))
			if ev == nil {
				return fail(os.Stderr, "submit", fmt.Errorf("--split %q: want none, fixed_bytes, lines or paragraphs", *split))
			}
			opts.Split.Strategy = gatewayv1.SplitStrategy(ev.Number())
		}
	}

	var in io.Reader = os.Stdin
	var size int64
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return fail(os.Stderr, "submit", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
		}
		in = f
		if opts.DisplayName == "" {
			opts.DisplayName = filepath.Base(path)
		}
		if opts.ContentType == "" {
			opts.ContentType = mime.TypeByExtension(filepath.Ext(path))
		}
	}
	if opts.ContentType == "" {
		opts.ContentType = "application/octet-stream"
	}

	c, err := cf.dial()
	if err != nil {
		return fail(os.Stderr, "submit", err)
	}
	defer c.Close()
	var bar *progress
	if *showProgress || term.IsTerminal(int(os.Stderr.Fd())) {
		bar = newProgress(os.Stderr, size)
	}
	doc, err := upload(c, opts, in, bar)
	if err != nil {
		return fail(os.Stderr, "submit", err)
	}
	fmt.Println(doc.GetId())
	return 0
}

// upload streams r as UploadDocument messages of 256 KiB.
func upload(c *client, opts *gatewayv1.SubmitOptions, r io.Reader, bar *progress) (*gatewayv1.Document, error) {
	stream, err := c.docs.UploadDocument(c.ctx)
	if err != nil {
		return nil, rpcError(err)
	}
	sendErr := stream.Send(&gatewayv1.UploadDocumentRequest{Options: opts})
	buf := make([]byte, 256<<10)
	for sendErr == nil {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			sendErr = stream.Send(&gatewayv1.UploadDocumentRequest{Chunk: buf[:n]})
			if bar != nil {
				bar.add(n)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read input: %w", rerr)
		}
	}
	if bar != nil {
		bar.finish()
	}
	doc, err := stream.CloseAndRecv() // reports the server's status if a Send failed
	if err != nil {
		return nil, rpcError(err)
	}
	return doc, nil
}
