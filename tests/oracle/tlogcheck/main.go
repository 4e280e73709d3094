// Command tlogcheck is a dev-only oracle for runledger's transparency log: it reads the log's public
// files (a folder or a URL prefix) with the Go checksum database's own code, golang.org/x/mod/sumdb/tlog
// and golang.org/x/mod/sumdb/note (the origin of the C2SP formats), and checks what runledger wrote:
//
//   - the checkpoint's signature (note.Open with the verifier key);
//   - the tree hash read from the hash tiles (tlog.TreeHash over the raw tiles) equals the checkpoint's root;
//   - every tile the checkpoint's size is served as is the one Go's own tree builder makes from the entry
//     bundles (tlog.StoredHashes, tlog.ReadTileData), byte for byte;
//   - inclusion of every leaf (or -sample N of them) and of each -proof (a C2SP tlog-proof text):
//     tlog.ProveRecord through tlog.TileHashReader (which authenticates every tile against the root)
//     and tlog.CheckRecord; a given proof's hashes must equal Go's;
//   - consistency: with -old F (an earlier signed checkpoint), tlog.ProveTree and tlog.CheckTree from it
//     to the current one; with -consistency F (`runledger tlog consistency`'s JSON), its roots against
//     tlog.TreeHash and its proof through tlog.CheckTree, equal to Go's tlog.ProveTree.
//
// Where C2SP differs from sumdb, handled here (and only here):
//   - the checkpoint body: C2SP tlog-checkpoint is "<origin>\n<size>\n<base64 root>\n[extensions]",
//     sumdb's is "go.sum database tree\n<size>\n<base64 root>\n" (tlog.ParseTree): parsed by hand;
//   - tile paths: sumdb's tlog.Tile.Path() is tile/<H>/<L>/<N>[.p/<W>] with the height as a path element
//     and data tiles at tile/<H>/data/...; C2SP's is tile/<L>/<N>[.p/<W>] (height fixed at 8) and
//     entry bundles at tile/entries/...: Go's path with the "8/" element taken out (its N and .p/W kept);
//   - entries: sumdb's data tiles are records each ending in a newline, C2SP's entry bundles are
//     big-endian uint16 length-prefixed entries: parsed by hand, each hashed with tlog.RecordHash;
//   - tlog-proof texts (c2sp.org/tlog-proof@v1) and runledger's consistency JSON are not sumdb's: parsed
//     by hand, their hashes handed to tlog.CheckRecord / tlog.CheckTree.
//
// Exit 0 printing what was checked, 1 with "FAIL: ..." at the first difference, 2 on a usage error.
// Builds offline against Debian's golang-golang-x-mod-dev:
//   GOPATH=/usr/share/gocode GO111MODULE=off go build -o tlogcheck ./tests/oracle/tlogcheck
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

const height = 8 // C2SP tlog-tiles: tiles are always of height 8
const maxRead = 1 << 20

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func fail(format string, args ...interface{}) {
	fmt.Printf("FAIL: "+format+"\n", args...)
	os.Exit(1)
}

// source reads the log's public files from a folder or over HTTP.
type source struct{ where string }

func (s source) read(rel string) ([]byte, error) {
	if strings.HasPrefix(s.where, "http://") || strings.HasPrefix(s.where, "https://") {
		resp, err := http.Get(strings.TrimRight(s.where, "/") + "/" + rel)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("%s: HTTP %d", rel, resp.StatusCode)
		}
		return io.ReadAll(io.LimitReader(resp.Body, maxRead))
	}
	return os.ReadFile(filepath.Join(s.where, filepath.FromSlash(rel)))
}

// c2spPath is tlog-tiles' path of a tile: Go's Tile.Path() without its height element, "data" as "entries".
func c2spPath(t tlog.Tile) string {
	p := t.Path()
	prefix := fmt.Sprintf("tile/%d/", height)
	if !strings.HasPrefix(p, prefix) {
		panic("unexpected tile path " + p)
	}
	p = "tile/" + strings.TrimPrefix(p, prefix)
	if t.L == -1 {
		p = strings.Replace(p, "tile/data/", "tile/entries/", 1)
	}
	return p
}

// tiles is a tlog.TileReader over the log's files.
type tiles struct{ src source }

func (r tiles) Height() int { return height }
func (r tiles) ReadTiles(ts []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(ts))
	for i, t := range ts {
		data, err := r.src.read(c2spPath(t))
		if err != nil {
			return nil, err
		}
		if len(data) != t.W*tlog.HashSize {
			return nil, fmt.Errorf("%s: %d bytes, not %d", c2spPath(t), len(data), t.W*tlog.HashSize)
		}
		out[i] = data
	}
	return out, nil
}
func (r tiles) SaveTiles([]tlog.Tile, [][]byte) {}

// served is the tile (level, n) as a tree of size n serves it: full, or partial at its exact width.
func served(level int, n int64, size int64) tlog.Tile {
	count := size >> uint(height*level)
	w := count - n<<height
	if w > 1<<height {
		w = 1 << height
	}
	return tlog.Tile{H: height, L: level, N: n, W: int(w)}
}

// rawHashes reads stored hashes straight from the tiles, unauthenticated (tlog.HashFromTile): the tree hash
// they give is then compared with the checkpoint's.
func rawHashes(r tiles, size int64) tlog.HashReader {
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			t := tlog.TileForIndex(height, x)
			t = served(t.L, t.N, size)
			data, err := r.ReadTiles([]tlog.Tile{t})
			if err != nil {
				return nil, err
			}
			if out[i], err = tlog.HashFromTile(t, data[0], x); err != nil {
				return nil, err
			}
		}
		return out, nil
	})
}

type checkpoint struct {
	origin string
	tree   tlog.Tree
	signed []byte
}

// openCheckpoint verifies a signed checkpoint with sumdb/note and parses its C2SP body.
func openCheckpoint(signed []byte, verifier note.Verifier) (checkpoint, error) {
	n, err := note.Open(signed, note.VerifierList(verifier))
	if err != nil {
		return checkpoint{}, fmt.Errorf("the signed note does not verify: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 || lines[len(lines)-1] != "" {
		return checkpoint{}, errors.New("a checkpoint is at least three lines")
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || (lines[1] != "0" && strings.HasPrefix(lines[1], "0")) {
		return checkpoint{}, fmt.Errorf("size %q is not a decimal", lines[1])
	}
	root, err := tlog.ParseHash(lines[2])
	if err != nil {
		return checkpoint{}, fmt.Errorf("root %q: %v", lines[2], err)
	}
	return checkpoint{origin: lines[0], tree: tlog.Tree{N: size, Hash: root}, signed: signed}, nil
}

// entries reads the entry bundles of a tree of `size`: uint16 length-prefixed entries.
func entries(src source, size int64) ([][]byte, error) {
	var out [][]byte
	for n := int64(0); n<<height < size; n++ {
		t := tlog.Tile{H: height, L: -1, N: n, W: 1 << height}
		if n<<height+1<<height > size {
			t.W = int(size - n<<height)
		}
		data, err := src.read(c2spPath(t))
		if err != nil {
			return nil, err
		}
		got := 0
		for at := 0; at < len(data); got++ {
			if at+2 > len(data) {
				return nil, fmt.Errorf("%s: cut inside a length", c2spPath(t))
			}
			l := int(binary.BigEndian.Uint16(data[at:]))
			if at+2+l > len(data) {
				return nil, fmt.Errorf("%s: cut inside an entry", c2spPath(t))
			}
			out = append(out, data[at+2:at+2+l])
			at += 2 + l
		}
		if got != t.W {
			return nil, fmt.Errorf("%s: %d entries, not %d", c2spPath(t), got, t.W)
		}
	}
	return out, nil
}

// memory is Go's own tree of the entries: every stored hash, as the sumdb server builds it.
func memory(es [][]byte) (tlog.HashReader, error) {
	var stored []tlog.Hash
	r := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			if x < 0 || x >= int64(len(stored)) {
				return nil, fmt.Errorf("stored hash %d not built", x)
			}
			out[i] = stored[x]
		}
		return out, nil
	})
	for i, e := range es {
		hs, err := tlog.StoredHashes(int64(i), e, r)
		if err != nil {
			return nil, err
		}
		stored = append(stored, hs...)
	}
	return r, nil
}

type tlogProof struct {
	index  int64
	hashes tlog.RecordProof
	signed []byte
}

func parseProof(text []byte) (tlogProof, error) {
	head, signed, ok := bytes.Cut(text, []byte("\n\n"))
	lines := strings.Split(string(head), "\n")
	if !ok || lines[0] != "c2sp.org/tlog-proof@v1" {
		return tlogProof{}, errors.New("not a c2sp.org/tlog-proof@v1 text")
	}
	rest := lines[1:]
	if len(rest) > 0 && strings.HasPrefix(rest[0], "extra ") {
		rest = rest[1:]
	}
	if len(rest) == 0 || !strings.HasPrefix(rest[0], "index ") {
		return tlogProof{}, errors.New("no index line")
	}
	index, err := strconv.ParseInt(rest[0][len("index "):], 10, 64)
	if err != nil {
		return tlogProof{}, err
	}
	p := tlogProof{index: index, signed: signed}
	for _, l := range rest[1:] {
		h, err := tlog.ParseHash(l)
		if err != nil {
			return tlogProof{}, err
		}
		p.hashes = append(p.hashes, h)
	}
	return p, nil
}

func sameProof(a, b []tlog.Hash) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type consistencyJSON struct {
	Origin  string   `json:"origin"`
	Old     int64    `json:"old"`
	New     int64    `json:"new"`
	OldRoot string   `json:"old_root"`
	NewRoot string   `json:"new_root"`
	Proof   []string `json:"proof"`
}

func main() {
	where := flag.String("log", "", "the log's folder or URL prefix (holding checkpoint and tile/)")
	vkey := flag.String("vkey", "", "the log's verifier key (sumdb/note form: name+hash+base64)")
	sample := flag.Int64("sample", 0, "check the inclusion of every Nth leaf (0: every leaf)")
	var olds, proofs, consistencies files
	flag.Var(&olds, "old", "an earlier signed checkpoint of the log: consistency to the current one (repeatable)")
	flag.Var(&proofs, "proof", "a C2SP tlog-proof text (runledger tlog prove --out F) (repeatable)")
	flag.Var(&consistencies, "consistency", "`runledger tlog consistency OLD NEW`'s JSON (repeatable)")
	flag.Parse()
	if *where == "" || *vkey == "" {
		fmt.Fprintln(os.Stderr, "usage: tlogcheck -log DIR|URL -vkey VKEY [-old F] [-proof F] [-consistency F] [-sample N]")
		os.Exit(2)
	}
	verifier, err := note.NewVerifier(strings.TrimSpace(*vkey))
	if err != nil {
		fmt.Fprintf(os.Stderr, "the verifier key: %v\n", err)
		os.Exit(2)
	}
	src := source{*where}
	tr := tiles{src}

	signed, err := src.read("checkpoint")
	if err != nil {
		fail("the checkpoint: %v", err)
	}
	cp, err := openCheckpoint(signed, verifier)
	if err != nil {
		fail("the checkpoint: %v", err)
	}
	size := cp.tree.N
	fmt.Printf("checkpoint: origin %s, size %d, root %s, signed by %s\n", cp.origin, size, cp.tree.Hash, verifier.Name())

	// the tiles, read raw, give the checkpoint's root
	th, err := tlog.TreeHash(size, rawHashes(tr, size))
	if err != nil {
		fail("tree hash from the tiles: %v", err)
	}
	if th != cp.tree.Hash {
		fail("the tiles give root %s, the checkpoint says %s", th, cp.tree.Hash)
	}
	fmt.Printf("tiles: tlog.TreeHash of the hash tiles = the checkpoint's root\n")

	// the entry bundles, through Go's own tree builder, give the same root and the same tiles, byte for byte
	es, err := entries(src, size)
	if err != nil {
		fail("the entry bundles: %v", err)
	}
	mem, err := memory(es)
	if err != nil {
		fail("building the tree of the entries: %v", err)
	}
	if eh, err := tlog.TreeHash(size, mem); err != nil || eh != cp.tree.Hash {
		fail("the entry bundles give root %s (%v), the checkpoint says %s", eh, err, cp.tree.Hash)
	}
	count := 0
	for _, t := range tlog.NewTiles(height, 0, size) {
		if t != served(t.L, t.N, size) {
			continue // (a narrower partial of an earlier size: tlog-tiles serves only the current width)
		}
		want, err := tlog.ReadTileData(t, mem)
		if err != nil {
			fail("tile %s from the entries: %v", c2spPath(t), err)
		}
		got, err := src.read(c2spPath(t))
		if err != nil {
			fail("tile %s: %v", c2spPath(t), err)
		}
		if !bytes.Equal(got, want) {
			fail("tile %s differs from the one Go builds from the entry bundles", c2spPath(t))
		}
		count++
	}
	fmt.Printf("entries: %d entry bundles' leaves give the root; all %d hash tiles equal Go's (tlog.StoredHashes, tlog.ReadTileData)\n",
		(size+255)/256, count)

	// inclusion of the leaves, through the authenticating tile reader
	auth := tlog.TileHashReader(cp.tree, tr)
	checked := 0
	for i := int64(0); i < size; i++ {
		if *sample > 1 && i%*sample != 0 && i != size-1 {
			continue
		}
		p, err := tlog.ProveRecord(size, i, auth)
		if err != nil {
			fail("tlog.ProveRecord(%d, %d): %v", size, i, err)
		}
		if err := tlog.CheckRecord(p, size, cp.tree.Hash, i, tlog.RecordHash(es[i])); err != nil {
			fail("leaf %d: tlog.CheckRecord: %v", i, err)
		}
		checked++
	}
	fmt.Printf("inclusion: %d leaves checked (tlog.ProveRecord through tlog.TileHashReader, tlog.CheckRecord)\n", checked)

	for _, f := range proofs {
		text, err := os.ReadFile(f)
		if err != nil {
			fail("%s: %v", f, err)
		}
		p, err := parseProof(text)
		if err != nil {
			fail("%s: %v", f, err)
		}
		pc, err := openCheckpoint(p.signed, verifier)
		if err != nil {
			fail("%s: its checkpoint: %v", f, err)
		}
		if pc.origin != cp.origin || pc.tree.N > size || p.index >= pc.tree.N {
			fail("%s: index %d under %s size %d, not of this log (%s size %d)", f, p.index, pc.origin, pc.tree.N, cp.origin, size)
		}
		if err := tlog.CheckRecord(p.hashes, pc.tree.N, pc.tree.Hash, p.index, tlog.RecordHash(es[p.index])); err != nil {
			fail("%s: leaf %d: tlog.CheckRecord: %v", f, p.index, err)
		}
		mine, err := tlog.ProveRecord(pc.tree.N, p.index, auth)
		if err != nil || !sameProof(mine, p.hashes) {
			fail("%s: the proof differs from tlog.ProveRecord's (%v)", f, err)
		}
		fmt.Printf("proof %s: leaf %d %s under size %d: ok\n", filepath.Base(f), p.index, es[p.index], pc.tree.N)
	}

	for _, f := range olds {
		text, err := os.ReadFile(f)
		if err != nil {
			fail("%s: %v", f, err)
		}
		old, err := openCheckpoint(text, verifier)
		if err != nil {
			fail("%s: %v", f, err)
		}
		if old.origin != cp.origin {
			fail("%s: a checkpoint of log %s, not %s", f, old.origin, cp.origin)
		}
		if old.tree.N > size {
			fail("%s: size %d is larger than the current %d: the log was truncated", f, old.tree.N, size)
		}
		p, err := tlog.ProveTree(size, old.tree.N, auth)
		if err == nil {
			err = tlog.CheckTree(p, size, cp.tree.Hash, old.tree.N, old.tree.Hash)
		}
		if err != nil {
			fail("%s: size %d is not consistent with the current size %d: %v", f, old.tree.N, size, err)
		}
		fmt.Printf("consistency: checkpoint %s (size %d) -> size %d: ok (tlog.ProveTree, tlog.CheckTree)\n", filepath.Base(f), old.tree.N, size)
	}

	for _, f := range consistencies {
		text, err := os.ReadFile(f)
		if err != nil {
			fail("%s: %v", f, err)
		}
		var c consistencyJSON
		if err := json.Unmarshal(text, &c); err != nil {
			fail("%s: %v", f, err)
		}
		if c.Origin != cp.origin || c.Old <= 0 || c.Old > c.New || c.New > size {
			fail("%s: sizes %d..%d of %s, not within this log (%s size %d)", f, c.Old, c.New, c.Origin, cp.origin, size)
		}
		oldRoot, err1 := base64.StdEncoding.DecodeString(c.OldRoot)
		newRoot, err2 := base64.StdEncoding.DecodeString(c.NewRoot)
		if err1 != nil || err2 != nil || len(oldRoot) != tlog.HashSize || len(newRoot) != tlog.HashSize {
			fail("%s: a root that is not a base64 hash", f)
		}
		var oh, nh tlog.Hash
		copy(oh[:], oldRoot)
		copy(nh[:], newRoot)
		for _, want := range []struct {
			n int64
			h tlog.Hash
		}{{c.Old, oh}, {c.New, nh}} {
			if got, err := tlog.TreeHash(want.n, auth); err != nil || got != want.h {
				fail("%s: the root of size %d is %s by tlog.TreeHash (%v), the proof says %s", f, want.n, got, err, want.h)
			}
		}
		var p tlog.TreeProof
		for _, s := range c.Proof {
			h, err := tlog.ParseHash(s)
			if err != nil {
				fail("%s: %v", f, err)
			}
			p = append(p, h)
		}
		if c.Old < c.New {
			if err := tlog.CheckTree(p, c.New, nh, c.Old, oh); err != nil {
				fail("%s: tlog.CheckTree(%d -> %d): %v", f, c.Old, c.New, err)
			}
			mine, err := tlog.ProveTree(c.New, c.Old, auth)
			if err != nil || !sameProof(mine, p) {
				fail("%s: the proof differs from tlog.ProveTree's (%v)", f, err)
			}
		} else if len(p) != 0 || oh != nh {
			fail("%s: equal sizes need an empty proof and equal roots", f)
		}
		fmt.Printf("consistency proof %s: size %d -> %d: ok (tlog.CheckTree; the same hashes as tlog.ProveTree)\n", filepath.Base(f), c.Old, c.New)
	}
	fmt.Println("ok")
}
