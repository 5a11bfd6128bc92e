package console

import (
	"slices"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/pkg/contract"
)

// With the effects in partitions, the picture shows each partition's
// stream, fed by the relay, feeding its notifier consumer; the effects'
// stream, gone, is not shown.
func TestThePictureShowsTheEffectsPartitions(t *testing.T) {
	c := &Console{rates: rates{}}
	r := &Reading{
		Streams: []pipeline.StreamStatus{{Name: contract.DocsStream, Exists: true}, {Name: contract.EventsStream},
			{Name: contract.EventsPartitionStream(0), Exists: true}, {Name: contract.EventsPartitionStream(1), Exists: true}},
		Consumers: []pipeline.ConsumerStatus{{Stream: contract.EventsPartitionStream(1), Name: contract.PartitionName("notifier", 1), Holder: "a"}},
	}
	byID := map[string]Stage{}
	for _, s := range c.stages(r, nil, time.Now()) {
		byID[s.ID] = s
	}
	slot := byID["slot:"]
	for _, name := range []string{contract.DocsStream, contract.EventsPartitionStream(0), contract.EventsPartitionStream(1)} {
		if _, ok := byID["stream:"+name]; !ok || !slices.Contains(slot.Feeds, "stream:"+name) {
			t.Errorf("stream %s: shown %v, fed by the relay: %v", name, ok, slot.Feeds)
		}
	}
	if _, ok := byID["stream:"+contract.EventsStream]; ok {
		t.Errorf("the missing effects' stream is shown")
	}
	consumer := "consumer:" + contract.EventsPartitionStream(1) + "/" + contract.PartitionName("notifier", 1)
	if _, ok := byID[consumer]; !ok || !slices.Contains(byID["stream:"+contract.EventsPartitionStream(1)].Feeds, consumer) {
		t.Errorf("the partition's consumer: %v; its stream feeds %v", byID[consumer], byID["stream:"+contract.EventsPartitionStream(1)].Feeds)
	}
}
