package roles

// ScramVerifier exposes the verifier to the tests, which log in with it.
var ScramVerifier = scramVerifier
