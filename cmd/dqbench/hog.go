package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"
)

// A hog is a competitor of the command's own, for measuring on a busy
// machine when the neighbours happen to be quiet: a process that keeps a
// share of every core busy, in bursts (at 0.175, 3.5 ms of every 20 ms),
// as a neighbour's work comes and goes.

const (
	hogRole   = "hog"
	hogPeriod = 20 * time.Millisecond
)

// startHog starts a hog process taking share of the machine's CPU, and
// returns the function that stops it.
func startHog(share float64) (stop func(), err error) {
	if share <= 0 || share >= 1 {
		return nil, fmt.Errorf("hog share %v: want more than 0 and less than 1", share)
	}
	self, err := selfBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, roleFlag, hogRole, strconv.FormatFloat(share, 'f', -1, 64))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() {
		stdin.Close() // the hog ends with its input, as it does when this process dies
		_ = cmd.Wait()
	}, nil
}

// runHog is the hog process: args is its share of the CPU. It runs until
// its standard input ends.
func runHog(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("hog: want one share, got %q", args)
	}
	share, err := strconv.ParseFloat(args[0], 64)
	if err != nil || share <= 0 || share >= 1 {
		return fmt.Errorf("hog: bad share %q", args[0])
	}
	busy := time.Duration(share * float64(hogPeriod))
	for range runtime.NumCPU() {
		go func() {
			for {
				end := time.Now().Add(busy)
				for time.Now().Before(end) {
				}
				time.Sleep(hogPeriod - busy)
			}
		}()
	}
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}
