package triton

// OnJoinedLoad makes b call f each time a Load has joined label's load call, so that a
// test can release a held load only after every caller it started is waiting on it.
func OnJoinedLoad(b *Backend, f func(label string)) { b.joinedLoad = f }
