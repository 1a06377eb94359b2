// ssync-go-sender: a /v1-ssync/ sender written with Go's net/http client, the client Longhorn's sparse-tools uses, to
// check our receiver against it. It sends the file in 2 MiB batches over 4 goroutines: an all-zero batch as
// sendHole, any other as getChecksum then writeData (Content-Length bodies, or chunked ones with -chunked, which
// Go's client uses for bodies of unknown length), then close.
//
//	go run . -file <path> -to <host:port> [-chunked]
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

const batch = 2 << 20

var client = &http.Client{Timeout: 30 * time.Second}

func call(method, to, action string, begin, end int64, body io.Reader, length int64) ([]byte, error) {
	req, err := http.NewRequest(method, fmt.Sprintf("http://%s/v1-ssync/%s", to, action), body)
	if err != nil {
		return nil, err
	}
	if body != nil && length < 0 {
		req.ContentLength = -1 // unknown length: Go sends the body chunked
	}
	req.Header.Add("Accept", "application/json")
	q := req.URL.Query()
	q.Add("begin", strconv.FormatInt(begin, 10))
	q.Add("end", strconv.FormatInt(end, 10))
	req.URL.RawQuery = q.Encode()
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s [%d, %d): HTTP %d: %s", action, begin, end, resp.StatusCode, bytes.TrimSpace(out))
	}
	return out, nil
}

func main() {
	file := flag.String("file", "", "file to send")
	to := flag.String("to", "", "receiver host:port")
	chunked := flag.Bool("chunked", false, "send writeData bodies chunked (unknown length)")
	flag.Parse()
	f, err := os.Open(*file)
	if err != nil {
		fail(err)
	}
	st, err := f.Stat()
	if err != nil {
		fail(err)
	}
	size := st.Size()
	if _, err := call("GET", *to, "open", 0, size, nil, 0); err != nil {
		fail(err)
	}
	offsets := make(chan int64)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	var mu sync.Mutex
	holes, data := 0, 0
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, batch)
			for off := range offsets {
				n := int64(batch)
				if off+n > size {
					n = size - off
				}
				if _, err := f.ReadAt(buf[:n], off); err != nil && err != io.EOF {
					errs <- err
					return
				}
				if bytes.Count(buf[:n], []byte{0}) == int(n) {
					if _, err := call("POST", *to, "sendHole", off, off+n, nil, 0); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					holes++
					mu.Unlock()
					continue
				}
				sum, err := call("GET", *to, "getChecksum", off, off+n, nil, 0)
				if err != nil {
					errs <- err
					return
				}
				var remote []byte
				if err := json.Unmarshal(sum, &remote); err != nil {
					errs <- fmt.Errorf("getChecksum answer %q: %v", sum, err)
					return
				}
				var body io.Reader = bytes.NewReader(buf[:n])
				length := n
				if *chunked {
					body = io.MultiReader(bytes.NewReader(buf[:n/2]), bytes.NewReader(buf[n/2:n]))
					length = -1
				}
				if _, err := call("POST", *to, "writeData", off, off+n, body, length); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				data++
				mu.Unlock()
			}
		}()
	}
	go func() {
		for off := int64(0); off < size; off += batch {
			offsets <- off
		}
		close(offsets)
	}()
	wg.Wait()
	select {
	case err := <-errs:
		fail(err)
	default:
	}
	if _, err := call("POST", *to, "close", 0, 0, nil, 0); err != nil {
		fail(err)
	}
	fmt.Printf("{\"dataBatches\":%d,\"holeBatches\":%d}\n", data, holes)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ssync-go-sender:", err)
	os.Exit(1)
}
