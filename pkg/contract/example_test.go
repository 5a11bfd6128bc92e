package contract_test

import (
	"fmt"

	"github.com/converge-sync/converge/pkg/contract"
)

// A producer can compute every identifier the pipeline will use before it
// writes anything: they depend on the key, version and position alone.
func Example() {
	key, version := "docs/intro.md", int64(3)
	fmt.Println("chunk 0:", contract.ChunkID(key, version, 0))
	fmt.Println("event:  ", contract.EventID(key, version, contract.KindUpserted))
	fmt.Println("subject:", contract.Subject(key))
	// Output:
	// chunk 0: 4eddabea-c7d8-56c0-b7a1-27226cc4835c
	// event:   492ccf8a-2617-5500-bdbe-0374803089f8
	// subject: converge.docs.22760d417a52c66f14bee182587d458d
}
