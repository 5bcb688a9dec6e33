package peer

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// textCorpus is prose with repeated words (so top words matter), words of
// every length, apostrophes, digits and multi-byte UTF-8 (letters and
// punctuation), so that random cuts split words and UTF-8 sequences.
func textCorpus(r *rand.Rand, n int) string {
	words := []string{"the", "the", "the", "a", "of", "and", "there", "then", "theme", "e", "th",
		"don't", "42", "x1", "naïve", "café", "Über", "straße", "日本語", "ελληνικά", "the—dash", "end."}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		switch r.IntN(8) {
		case 0:
			b.WriteString(". ")
		case 1:
			b.WriteString("\n")
		case 2:
			b.WriteString(" — ")
		default:
			b.WriteString(" ")
		}
	}
	return b.String()
}

func partialOf(t *testing.T, o *Output) *textPartial {
	t.Helper()
	p, ok := o.Partial.(*textPartial)
	if !ok {
		t.Fatalf("output has no textstats partial: %T", o.Partial)
	}
	return p
}

// cutAt splits s at the given sorted byte offsets (anywhere, also inside a
// UTF-8 sequence, as fixed-byte chunking does).
func cutAt(s string, cuts []int) []string {
	var out []string
	prev := 0
	for _, c := range cuts {
		out = append(out, s[prev:c])
		prev = c
	}
	return append(out, s[prev:])
}

// Merging the stats of fixed-byte chunks cut at random points equals the
// stats of the whole document, word counts (the full map, hence top words)
// included; also when merged results are merged again (nested scopes).
func TestTextStatsRandomCutsEqualWhole(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		doc := textCorpus(r, 200+r.IntN(2000))
		wholeOut, _ := TextStats{}.Process(ctx, input(nil, doc))
		whole := partialOf(t, wholeOut)
		want := stats(t, wholeOut)

		cuts := make([]int, r.IntN(40)+1)
		for i := range cuts {
			cuts[i] = 1 + r.IntN(len(doc)-1)
		}
		if iter%3 == 0 { // tiny chunks: words spanning several chunks
			cuts = cuts[:0]
			for c := 1 + r.IntN(3); c < len(doc); c += 1 + r.IntN(3) {
				cuts = append(cuts, c)
			}
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		chunks := cutAt(doc, cuts)
		outs := make([]*Output, len(chunks))
		for i, c := range chunks {
			outs[i], _ = TextStats{}.Process(ctx, input(nil, c))
		}
		merged, err := TextStats{}.Rehydrate(ctx, outs)
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, m *Output) {
			t.Helper()
			got := stats(t, m)
			if got.Words != want.Words || got.Bytes != want.Bytes || got.Lines != want.Lines {
				t.Fatalf("iter %d %s: %d chunks: words/bytes/lines %d/%d/%d, whole %d/%d/%d", iter, what, len(chunks),
					got.Words, got.Bytes, got.Lines, want.Words, want.Bytes, want.Lines)
			}
			if !slices.Equal(got.TopWords, want.TopWords) {
				t.Fatalf("iter %d %s: top words %v, whole %v", iter, what, got.TopWords, want.TopWords)
			}
			if gc := partialOf(t, m).counts; !maps.Equal(gc, whole.counts) {
				for w, c := range gc {
					if whole.counts[w] != c {
						t.Errorf("iter %d %s: word %q counted %d, whole %d", iter, what, w, c, whole.counts[w])
					}
				}
				for w, c := range whole.counts {
					if _, ok := gc[w]; !ok {
						t.Errorf("iter %d %s: word %q missing, whole %d", iter, what, w, c)
					}
				}
				t.FailNow()
			}
		}
		check("flat", merged)

		// Nested: merge groups of chunks, then the groups.
		split := r.IntN(len(outs) + 1)
		a, _ := TextStats{}.Rehydrate(ctx, outs[:split])
		b, _ := TextStats{}.Rehydrate(ctx, outs[split:])
		nested, _ := TextStats{}.Rehydrate(ctx, []*Output{a, b})
		check("nested", nested)
	}
}

// The reported failure: "the" cut as "th|e" must count as "the", never as
// "th" and "e".
func TestTextStatsCutWordTopWords(t *testing.T) {
	ctx := context.Background()
	a, _ := TextStats{}.Process(ctx, input(nil, "the cat and th"))
	b, _ := TextStats{}.Process(ctx, input(nil, "e dog"))
	m, _ := TextStats{}.Rehydrate(ctx, []*Output{a, b})
	got := stats(t, m)
	if got.Words != 5 || got.TopWords[0] != (WordCount{"the", 2}) {
		t.Fatalf("merged %+v, want 5 words with the=2", got)
	}
	for _, wc := range got.TopWords {
		if wc.Word == "e" || wc.Word == "th" {
			t.Fatalf("fragment %q counted: %+v", wc.Word, got.TopWords)
		}
	}
}
