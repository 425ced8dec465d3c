package dashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

type promAPI struct{ base string }

type sample struct {
	Metric    map[string]string `json:"metric"`
	Value     []any             `json:"value"`     // [time, "float"]
	Histogram []any             `json:"histogram"` // [time, {...}]: a native histogram
}

type result []sample

// finite counts the samples with a finite float value (histogram samples
// count too).
func (r result) finite() int {
	n := 0
	for _, s := range r {
		if s.Histogram != nil {
			n++
			continue
		}
		if len(s.Value) == 2 {
			str, _ := s.Value[1].(string)
			if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
				n++
			}
		}
	}
	return n
}

func (p *promAPI) get(path string, params url.Values, into any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %s: %v", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, into)
}

func (p *promAPI) query(expr string) (result, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     result `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", data.ResultType)
	}
	return data.Result, nil
}

// scalar is the value of a query that must return exactly one float sample.
func (p *promAPI) scalar(expr string) (float64, error) {
	res, err := p.query(expr)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Value) != 2 {
		return 0, fmt.Errorf("%d series", len(res))
	}
	str, _ := res[0].Value[1].(string)
	return strconv.ParseFloat(str, 64)
}

func (p *promAPI) labelValues(label, selector string) ([]string, error) {
	var vs []string
	err := p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {selector}}, &vs)
	return vs, err
}
