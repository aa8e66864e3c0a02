package logcollector

import "io"

// rawLines are lines already built, for tests of the store alone.
type rawLines []byte

func (l rawLines) Size() int64 { return int64(len(l)) }

func (l rawLines) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(l)
	return int64(n), err
}
