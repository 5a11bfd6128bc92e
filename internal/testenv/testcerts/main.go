// Command testcerts writes a test run's certificates into a folder: a CA
// made for the run and a server key pair it signed, valid for 127.0.0.1
// and localhost (see [testenv.WriteCertificates]). Scripts that start a
// test server outside a Go test, such as scripts/neo4j-server.sh, use it
// so that their server and the Go tests share one kind of certificate.
//
// Usage: go run ./internal/testenv/testcerts DIR
//
// It prints the CA's path, which clients trust.
package main

import (
	"fmt"
	"os"

	"github.com/converge-sync/converge/internal/testenv"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testcerts DIR")
		os.Exit(2)
	}
	c, err := testenv.WriteCertificates(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "testcerts:", err)
		os.Exit(1)
	}
	fmt.Println(c.CAFile)
}
