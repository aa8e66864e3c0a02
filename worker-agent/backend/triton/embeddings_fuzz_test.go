package triton

import (
	"encoding/json"
	"testing"
)

// Triton's infer answer is input from another process: whatever it holds, embeddings
// either refuses it or returns exactly n rows of one width, all numbers, without
// panicking on a shape that overflows or disagrees with the data.
func FuzzEmbeddings(f *testing.F) {
	for _, s := range []string{
		`{"outputs":[{"name":"embedding","datatype":"FP32","shape":[2,3],"data":[1,2,3,4,5,6]}]}`,
		`{"outputs":[{"name":"embedding","datatype":"FP32","shape":[2,3],"data":[[1,2,3],[4,5,6]]}]}`,
		`{"outputs":[{"name":"embedding","datatype":"FP16","shape":[2,1,3],"data":[1,2,3,4,5,6]}]}`,
		`{"outputs":[{"name":"other","datatype":"FP32","shape":[1],"data":[1]}]}`,
		`{"outputs":[{"name":"embedding","datatype":"FP32","shape":[4294967296,4294967296,2],"data":[1,2]}]}`,
		`{"outputs":[{"name":"embedding","datatype":"FP32","shape":[2,0],"data":[]}]}`,
		`{"outputs":[{"name":"embedding","datatype":"BYTES","shape":[2],"data":["a","b"]}]}`,
	} {
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		rows, err := embeddings(body, "embedding", int(n)+1)
		if err != nil {
			if rows != nil {
				t.Fatalf("error %v with rows %v", err, rows)
			}
			return
		}
		if len(rows) != int(n)+1 {
			t.Fatalf("%d rows, want %d", len(rows), int(n)+1)
		}
		for i, r := range rows {
			if len(r) == 0 || len(r) != len(rows[0]) {
				t.Fatalf("row %d has %d values, row 0 has %d", i, len(r), len(rows[0]))
			}
			for _, v := range r {
				if _, err := json.Marshal(v); err != nil {
					t.Fatalf("row %d holds %q, not a number: %v", i, v, err)
				}
			}
		}
	})
}
