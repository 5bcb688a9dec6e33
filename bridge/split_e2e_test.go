package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func textOf(lines int) []byte {
	var sb strings.Builder
	for i := range lines {
		fmt.Fprintf(&sb, "Line %d has some words in it. And a second sentence here!\n", i)
		if i%5 == 4 {
			sb.WriteString("\n")
		}
	}
	return []byte(sb.String())
}

func TestUploadLinesAndParagraphs(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := textOf(400)
	for _, st := range []gatewayv1.SplitStrategy{gatewayv1.SplitStrategy_SPLIT_LINES, gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS} {
		t.Run(st.String(), func(t *testing.T) {
			doc, err := e.b.Upload(context.Background(), "", &gatewayv1.SubmitOptions{ContentType: "text/plain",
				Split: &gatewayv1.SplitOptions{Strategy: st, ChunkBytes: 1000}}, bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			got := e.wait(doc.Id, 20*time.Second)
			if got.State != gatewayv1.State_SUCCEEDED {
				t.Fatalf("state %s error %q", got.State, got.Error)
			}
			if res := e.result(doc.Id); !bytes.Equal(res, content) {
				t.Fatalf("result differs (%d vs %d bytes)", len(res), len(content))
			}
			chunks := 0
			for _, ent := range got.Entities {
				if ent.ParentId == 0 {
					continue
				}
				chunks++
				if ent.SizeBytes > 1000 {
					t.Fatalf("chunk %d is %d bytes > chunk_bytes", ent.ChunkIndex, ent.SizeBytes)
				}
				end := content[ent.ChunkOffset+ent.SizeBytes-1]
				if end != '\n' {
					t.Fatalf("chunk %d does not end at a line boundary", ent.ChunkIndex)
				}
				if st == gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS && ent.ChunkOffset+ent.SizeBytes < uint64(len(content)) &&
					content[ent.ChunkOffset+ent.SizeBytes-2] != '\n' {
					t.Fatalf("chunk %d does not end at a paragraph boundary", ent.ChunkIndex)
				}
			}
			if chunks < len(content)/1000 {
				t.Fatalf("only %d chunks for %d bytes", chunks, len(content))
			}
		})
	}
}

func TestTextStats(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := textOf(200)
	doc := e.submit(content, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 2048, Processor: "textstats"}})
	got := e.wait(doc.Id, 20*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	var st struct {
		Bytes, Lines, Words, Sentences uint64
	}
	if err := json.Unmarshal(e.result(doc.Id), &st); err != nil {
		t.Fatal(err)
	}
	words := uint64(len(strings.Fields(string(content))))
	if st.Bytes != uint64(len(content)) || st.Words != words || st.Sentences != 400 {
		t.Fatalf("stats %+v, want bytes %d words %d sentences 400", st, len(content), words)
	}
}

func TestSentencesLayer1Digest(t *testing.T) {
	forFormats(t, func(t *testing.T, opts ...envOpt) {
		e := newEnv(t, opts...)
		e.waitReady()
		content := []byte("First sentence. Second one! Third?\nFourth sentence here. Fifth.\n")
		doc := e.submit(content, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
			Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 40, Processor: "sentences", MaxDepth: 1}})
		got := e.wait(doc.Id, 20*time.Second)
		if got.State != gatewayv1.State_SUCCEEDED {
			t.Fatalf("state %s error %q", got.State, got.Error)
		}
		want := "First sentence.\nSecond one!\nThird?\nFourth sentence here.\nFifth.\n"
		if res := e.result(doc.Id); string(res) != want {
			t.Fatalf("result %q, want %q", res, want)
		}
		if len(got.Digests) == 0 {
			t.Fatal("no scope digests recorded")
		}
		for _, d := range got.Digests {
			if !d.Verified {
				t.Fatalf("digest of scope %d not verified: %v (error %q)", d.ScopeId, d, got.Error)
			}
		}
		sub := 0
		for _, ent := range got.Entities {
			if ent.ScopeId != 0 {
				sub++
				if ent.Depth != 1 || ent.Status != gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE {
					t.Fatalf("sub-entity %v", ent)
				}
			}
		}
		if sub != 5 {
			t.Fatalf("%d sub-entities, want 5 sentences", sub)
		}
	})
}

// TestSentencesOneMiBChunks: 2 MiB of ordinary short sentences in 1 MiB
// line-aligned chunks through sentences at depth 1 (issue 23 item 8: every
// chunk FAILED with PIPESTREAM_ENTITY_TOO_LARGE, 1,000 sentences per chunk
// at most): the document SUCCEEDS, every sentence on its own line in
// order, each chunk nested in at most 1,000 verified sub-entities.
func TestSentencesOneMiBChunks(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	var content, want bytes.Buffer
	for i := 0; content.Len() < 2<<20; i++ {
		fmt.Fprintf(&content, "It is %d. Yes.", i)
		fmt.Fprintf(&want, "It is %d.\nYes.\n", i)
		if i%8 == 7 {
			content.WriteByte('\n')
		} else {
			content.WriteByte(' ')
		}
	}
	doc := e.submit(content.Bytes(), &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 1 << 20, Processor: "sentences", MaxDepth: 1}})
	got := e.wait(doc.Id, 60*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, want.Bytes()) {
		t.Fatalf("result: %d bytes, want %d (every sentence on its line, in order)", len(res), want.Len())
	}
	if len(got.Digests) < 2 {
		t.Fatalf("%d scope digests, want one per chunk (>= 2)", len(got.Digests))
	}
	for _, d := range got.Digests {
		if !d.Verified || d.EntitiesProcessed == 0 || d.EntitiesProcessed > 1000 {
			t.Fatalf("digest %v: want verified, 1 to 1,000 sub-entities", d)
		}
	}
}
