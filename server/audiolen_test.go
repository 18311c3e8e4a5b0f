package server

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"
)

// riff builds a RIFF/WAVE file of the given chunks (id, body), each padded
// to an even length as RIFF requires.
func riff(chunks ...any) []byte {
	var b bytes.Buffer
	b.WriteString("RIFF\x00\x00\x00\x00WAVE")
	for i := 0; i+1 < len(chunks); i += 2 {
		body := chunks[i+1].([]byte)
		b.WriteString(chunks[i].(string))
		binary.Write(&b, binary.LittleEndian, uint32(len(body)))
		b.Write(body)
		if len(body)%2 == 1 {
			b.WriteByte(0)
		}
	}
	return b.Bytes()
}

// fmtChunk is a fmt chunk: format tag, channels, rate, bits; its byte-rate
// field is byteRate (a reader that trusts it is misled when it lies).
func fmtChunk(tag, channels uint16, rate, byteRate uint32, bits uint16) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint16(b[0:], tag)
	binary.LittleEndian.PutUint16(b[2:], channels)
	binary.LittleEndian.PutUint32(b[4:], rate)
	binary.LittleEndian.PutUint32(b[8:], byteRate)
	binary.LittleEndian.PutUint16(b[12:], channels*bits/8)
	binary.LittleEndian.PutUint16(b[14:], bits)
	return b
}

// oggPage is one Ogg page of the stream serial holding packets (each under
// 255 bytes).
func oggPage(serial byte, packets ...[]byte) []byte {
	b := []byte("OggS\x00\x00")
	b = append(b, make([]byte, 8)...)
	b = append(b, serial, 0, 0, 0)
	b = append(b, make([]byte, 8)...)
	b = append(b, byte(len(packets)))
	for _, p := range packets {
		b = append(b, byte(len(p)))
	}
	for _, p := range packets {
		b = append(b, p...)
	}
	return b
}

func TestAudioDurationIsWhatTheEngineDecodes(t *testing.T) {
	pcm := func(n int) []byte { return make([]byte, n) }
	opusHead := []byte("OpusHead\x01\x01\x38\x01\x80\x3e\x00\x00\x00\x00\x00")
	opusTags := []byte("OpusTags\x00\x00\x00\x00")
	vorbisID := append([]byte("\x01vorbis\x00\x00\x00\x00\x01"), 0x40, 0x1f, 0, 0) // 8000 Hz
	vorbisID = append(vorbisID, make([]byte, 12)...)
	vorbisID = append(vorbisID, 0xb8, 0x01) // blocksizes 256 and 2048
	for _, tc := range []struct {
		name    string
		file    []byte
		seconds float64
		refused bool
	}{
		{"plain PCM", riff("fmt ", fmtChunk(1, 1, 16000, 32000, 16), "data", pcm(64000)), 2, false},
		{"JUNK, LIST and bext before fmt", riff("JUNK", bytes.Repeat([]byte{0xff}, 28), "LIST", pcm(13), "bext", pcm(602), "fmt ", fmtChunk(1, 2, 8000, 32000, 16), "data", pcm(96000)), 3, false},
		{"a byte rate that lies", riff("fmt ", fmtChunk(1, 1, 16000, 1<<31, 16), "data", pcm(320000)), 10, false},
		{"a data size past the file's end", append(riff("fmt ", fmtChunk(1, 1, 8000, 8000, 8)), []byte("data\xff\xff\xff\xff")...), 0, false},
		{"no fmt", riff("data", pcm(100)), 0, true},
		{"no data", riff("fmt ", fmtChunk(1, 1, 8000, 8000, 8)), 0, true},
		{"a compressed format tag", riff("fmt ", fmtChunk(0x55, 1, 8000, 1000, 8), "data", pcm(100)), 0, true},
		{"ogg opus, 20 ms packets, two frames each", append(append(oggPage(1, opusHead), oggPage(1, opusTags)...), oggPage(1, packets(100, []byte{19<<3 | 1, 0, 0})...)...), 4, false},
		{"ogg opus, code 3 with 6 frames of 20 ms", append(append(oggPage(1, opusHead), oggPage(1, opusTags)...), oggPage(1, packets(50, []byte{19<<3 | 3, 6})...)...), 6, false},
		{"ogg opus, another stream's packets not counted", append(append(oggPage(1, opusHead), oggPage(1, opusTags)...), append(oggPage(1, []byte{19 << 3}), oggPage(2, packets(50, []byte{19 << 3})...)...)...), 0.02, false},
		{"ogg vorbis, at most 1024 samples a packet", append(append(oggPage(1, vorbisID), oggPage(1, []byte("\x03vorbis"), []byte("\x05vorbis"))...), oggPage(1, packets(80, []byte{0})...)...), 80 * 1024.0 / 8000, false},
		{"mp3, MPEG-1 Layer III 128 kbit/s", mp3Frames(100, 0xfffb9000, 417), 100 * 1152 / 44100.0, false},
		{"mp3 after an ID3v2 tag and garbage", append(append([]byte("ID3\x04\x00\x00\x00\x00\x00\x05hello"), 1, 2, 3), mp3Frames(10, 0xffe31800, 72)...), 10 * 0.072, false},
		{"mp3 of free-format frames at 6 kbit/s", mp3Frames(10, 0xfffb0000, 100), 1000 / 750.0, false},
		{"m4a, AAC-LC at 16 kHz", m4aFile(9375, 9000, []byte{0x14, 0x08}), 600, false},
		{"m4a whose timestamps claim less than its frames", m4aFile(9375, 10, []byte{0x14, 0x08}), 600, false},
		{"m4a of another codec at 6 kbit/s", bytes.Replace(m4aFile(10, 10, []byte{0x14, 0x08}), []byte("mp4a"), []byte("alac"), 1), float64(len(m4aFile(10, 10, []byte{0x14, 0x08}))) / 750, false},
		{"another container at 6 kbit/s", pcm(7500), 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := audioDuration(tc.file)
			if (err != nil) != tc.refused {
				t.Fatalf("refused: %v, want %v", err, tc.refused)
			}
			if !tc.refused && math.Abs(got-tc.seconds) > 1e-9 {
				t.Fatalf("%v s, want %v", got, tc.seconds)
			}
		})
	}
}

// TestAudioChunksAsVLLMSplits: audio over the 30 s clip is split into
// chunks of at least 29 s (the 1 s overlap searched for a quiet point).
func TestAudioChunksAsVLLMSplits(t *testing.T) {
	for _, tc := range []struct {
		seconds float64
		chunks  int64
	}{{0, 1}, {30, 1}, {30.01, 2}, {59, 2}, {59.01, 3}, {600, 21}} {
		if got := audioChunks(tc.seconds); got != tc.chunks {
			t.Errorf("%v s: %d chunks, want %d", tc.seconds, got, tc.chunks)
		}
	}
}

// packets is n copies of p.
func packets(n int, p []byte) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = p
	}
	return out
}

// mp3Frames is n frames of header h, each size bytes long.
func mp3Frames(n int, h uint32, size int) []byte {
	var b []byte
	for range n {
		frame := make([]byte, size)
		binary.BigEndian.PutUint32(frame, h)
		b = append(b, frame...)
	}
	return b
}

// box is an MP4 box of typ holding the payloads.
func box(typ string, payloads ...[]byte) []byte {
	body := bytes.Join(payloads, nil)
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	return append(append(b, typ...), body...)
}

// m4aFile is an MP4 file with one AAC track of frames frames (stsz), whose
// stts lists sttsFrames, and the AudioSpecificConfig asc.
func m4aFile(frames, sttsFrames uint32, asc []byte) []byte {
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	dsi := append([]byte{5, byte(len(asc))}, asc...)
	dcd := append(append([]byte{4, byte(13 + len(dsi)), 0x40, 0x15}, make([]byte, 11)...), dsi...)
	es := append([]byte{3, byte(3 + len(dcd)), 0, 1, 0}, dcd...)
	esds := box("esds", u32(0), es)
	entry := box("mp4a", make([]byte, 6), []byte{0, 1}, make([]byte, 8), []byte{0, 1, 0, 16, 0, 0, 0, 0}, u32(16000<<16), esds)
	stsd := box("stsd", u32(0), u32(1), entry)
	stts := box("stts", u32(0), u32(1), u32(sttsFrames), u32(1024))
	stsz := box("stsz", u32(0), u32(0), u32(frames), make([]byte, 4*frames))
	hdlr := box("hdlr", u32(0), u32(0), []byte("soun"), make([]byte, 12))
	moov := box("moov", box("trak", box("mdia", hdlr, box("minf", box("stbl", stsd, stts, stsz)))))
	return append(box("ftyp", []byte("M4A "), u32(0)), moov...)
}

// FuzzAudioDurationNeverPanics: the length readers run on uploaded bytes.
func FuzzAudioDurationNeverPanics(f *testing.F) {
	f.Add(riff("fmt ", fmtChunk(1, 1, 8000, 8000, 8), "data", make([]byte, 10)))
	f.Add(m4aFile(3, 3, []byte{0x14, 0x08}))
	f.Add(mp3Frames(3, 0xfffb9000, 417))
	f.Add(append(oggPage(1, []byte("OpusHead")), oggPage(1, []byte{1, 2})...))
	f.Add([]byte("fLaC\x00\x00\x00\x22"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := audioDuration(b); err == nil && (s < 0 || math.IsNaN(s)) {
			t.Fatalf("length %v", s)
		}
	})
}
