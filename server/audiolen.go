package server

import (
	"bytes"
	"encoding/binary"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The length of an uploaded audio file, read from its container as the
// engine's decoder will find it: the reservation of the audio endpoints
// (audio.go) rests on it.

// audioDuration is the length of the audio the engine decodes from f, in
// seconds: from a WAV's fmt and data chunks, a FLAC's STREAMINFO, an Ogg
// Opus stream's packets (their TOC bytes), an Ogg Vorbis stream's packets
// (each at most half its long block), an MP3 file's frames or an MP4/M4A
// file's AAC frames; any other container at
// audioFloorBytesPerSecond. A WAV or FLAC file that does not state its
// length is refused.
func audioDuration(f []byte) (float64, error) {
	switch {
	case len(f) >= 12 && string(f[:4]) == "RIFF" && string(f[8:12]) == "WAVE":
		return wavDuration(f)
	case len(f) >= 4 && string(f[:4]) == "fLaC":
		return flacDuration(f)
	case len(f) >= 4 && string(f[:4]) == "OggS":
		if s, ok := oggDuration(f); ok {
			return s, nil
		}
	case len(f) >= 8 && string(f[4:8]) == "ftyp":
		if s, ok := mp4Duration(f); ok {
			return s, nil
		}
	case len(f) >= 10 && string(f[:3]) == "ID3", len(f) >= 4 && f[0] == 0xff && f[1]&0xe0 == 0xe0:
		if s, ok := mp3Duration(f); ok {
			return s, nil
		}
	}
	return float64(len(f)) / audioFloorBytesPerSecond, nil
}

// wavDuration walks a RIFF file's chunks (JUNK, LIST, bext and others may
// come before fmt) to fmt and data, as libsndfile does: the frames are the
// data chunk's bytes (at most what the file holds) over the frame size the
// fmt chunk states (channels × bits per sample), not its byte-rate field.
func wavDuration(f []byte) (float64, error) {
	var channels, bits, format uint16
	var rate uint32
	for off := 12; off+8 <= len(f); {
		id, size := string(f[off:off+4]), int64(binary.LittleEndian.Uint32(f[off+4:off+8]))
		body := off + 8
		switch id {
		case "fmt ":
			if size < 16 || int64(body)+16 > int64(len(f)) {
				return 0, apierr.BadRequest("file", "the WAV file's fmt chunk is cut short")
			}
			format = binary.LittleEndian.Uint16(f[body:])
			channels = binary.LittleEndian.Uint16(f[body+2:])
			rate = binary.LittleEndian.Uint32(f[body+4:])
			bits = binary.LittleEndian.Uint16(f[body+14:])
		case "data":
			if rate == 0 || channels == 0 || bits < 8 {
				return 0, apierr.BadRequest("file", "the WAV file has no fmt chunk (channels, sample rate, bits per sample) before its data")
			}
			switch format {
			case 1, 3, 6, 7, 0xFFFE: // PCM, float, A-law, µ-law, extensible
			default:
				return 0, apierr.BadRequest("file", "the WAV file's format tag %#x is compressed; send PCM WAV or another container", format)
			}
			n := min(size, int64(len(f)-body))
			frame := int64(channels) * int64((bits+7)/8)
			return float64(n/frame) / float64(rate), nil
		}
		next := int64(body) + size + size&1
		if next > int64(len(f)) {
			break
		}
		off = int(next)
	}
	return 0, apierr.BadRequest("file", "the WAV file has no fmt and data chunks")
}

// flacDuration reads STREAMINFO, the first metadata block: total samples
// over the sample rate, as libsndfile reports the file's frames.
func flacDuration(f []byte) (float64, error) {
	if len(f) < 8+34 || f[4]&0x7f != 0 {
		return 0, apierr.BadRequest("file", "the FLAC file does not start with its STREAMINFO block")
	}
	si := f[8:42]
	rate := uint32(si[10])<<12 | uint32(si[11])<<4 | uint32(si[12])>>4
	total := uint64(si[13]&0x0f)<<32 | uint64(binary.BigEndian.Uint32(si[14:18]))
	if rate == 0 || total == 0 {
		return 0, apierr.BadRequest("file", "the FLAC file does not state its length (total samples) in STREAMINFO")
	}
	return float64(total) / float64(rate), nil
}

// oggDuration walks an Ogg file's pages and the packets of its first
// stream: Opus packets last what their TOC bytes say (RFC 6716 §3.1, at
// most 120 ms each); Vorbis packets at most half the long block each
// (Vorbis I §4.3.8). ok is false for another codec.
func oggDuration(f []byte) (float64, bool) {
	var (
		codec    string // "opus" or "vorbis"
		serial   []byte
		packets  int // packets started
		inPacket bool
		seconds  float64
		vorbis   float64 // seconds per Vorbis audio packet
	)
	for off := 0; off+27 <= len(f) && bytes.Equal(f[off:off+4], []byte("OggS")); {
		nseg := int(f[off+26])
		if off+27+nseg > len(f) {
			break
		}
		if serial == nil {
			serial = f[off+14 : off+18]
		}
		lacing := f[off+27 : off+27+nseg]
		pos := off + 27 + nseg
		mine := bytes.Equal(f[off+14:off+18], serial)
		for _, l := range lacing {
			seg := f[min(pos, len(f)):min(pos+int(l), len(f))]
			if mine && !inPacket && len(seg) > 0 {
				switch packets {
				case 0:
					switch {
					case bytes.HasPrefix(seg, []byte("OpusHead")):
						codec = "opus"
					case bytes.HasPrefix(seg, []byte("\x01vorbis")) && len(seg) >= 29:
						codec = "vorbis"
						rate := binary.LittleEndian.Uint32(seg[12:16])
						if rate == 0 {
							return 0, false
						}
						vorbis = float64(uint32(1)<<(seg[28]>>4)/2) / float64(rate)
					default:
						return 0, false
					}
				default:
					switch {
					case codec == "opus" && packets >= 2:
						seconds += opusPacketSeconds(seg)
					case codec == "vorbis" && packets >= 3:
						seconds += vorbis
					}
				}
				packets++
			}
			if mine {
				inPacket = l == 255
			}
			pos += int(l)
		}
		off = pos
	}
	return seconds, codec != ""
}

// opusPacketSeconds is an Opus packet's duration from its TOC byte (and
// frame count byte for code 3), at most 120 ms.
func opusPacketSeconds(p []byte) float64 {
	toc := p[0]
	cfg := toc >> 3
	var frame float64 // ms
	switch {
	case cfg < 12: // SILK: 10, 20, 40, 60 ms
		frame = [4]float64{10, 20, 40, 60}[cfg%4]
	case cfg < 16: // hybrid: 10, 20 ms
		frame = [2]float64{10, 20}[cfg%2]
	default: // CELT: 2.5, 5, 10, 20 ms
		frame = [4]float64{2.5, 5, 10, 20}[cfg%4]
	}
	frames := 1.0
	switch toc & 3 {
	case 1, 2:
		frames = 2
	case 3:
		frames = 120 / frame // the most a packet may hold
		if len(p) > 1 {
			frames = float64(p[1] & 0x3f)
		}
	}
	return min(frame*frames, 120) / 1000
}

// mp3Duration walks an MPEG audio file's frames (after an ID3v2 tag) and
// sums their samples, skipping bytes that are not a frame header as a
// decoder resynchronises. ok is false for free-format frames (no bitrate
// to size them by) or a file with no frame.
func mp3Duration(f []byte) (float64, bool) {
	off := 0
	if string(f[:3]) == "ID3" {
		size := int(f[6]&0x7f)<<21 | int(f[7]&0x7f)<<14 | int(f[8]&0x7f)<<7 | int(f[9]&0x7f)
		off = 10 + size
		if f[5]&0x10 != 0 { // a footer
			off += 10
		}
	}
	var seconds float64
	frames := 0
	for off+4 <= len(f) {
		h := binary.BigEndian.Uint32(f[off:])
		n, samples, rate, ok := mp3Frame(h)
		if !ok {
			off++
			continue
		}
		if n == 0 {
			return 0, false // free format
		}
		seconds += float64(samples) / float64(rate)
		frames++
		off += n
	}
	return seconds, frames > 0
}

// mp3Frame reads an MPEG audio frame header: the frame's length in bytes
// (0 for free format), its samples and sample rate; ok is false if h is
// not a valid header.
func mp3Frame(h uint32) (n, samples, rate int, ok bool) {
	if h>>21 != 0x7ff {
		return 0, 0, 0, false
	}
	version, layer := (h>>19)&3, (h>>17)&3 // version: 0 MPEG-2.5, 2 MPEG-2, 3 MPEG-1; layer: 3 I, 2 II, 1 III
	brIdx, srIdx, pad := (h>>12)&15, (h>>10)&3, int((h>>9)&1)
	if version == 1 || layer == 0 || brIdx == 15 || srIdx == 3 {
		return 0, 0, 0, false
	}
	rate = [3]int{44100, 48000, 32000}[srIdx]
	switch version {
	case 2:
		rate /= 2
	case 0:
		rate /= 4
	}
	v1 := version == 3
	var kbps [16]int
	switch {
	case v1 && layer == 3:
		kbps = [16]int{0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448}
	case v1 && layer == 2:
		kbps = [16]int{0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384}
	case v1:
		kbps = [16]int{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}
	case layer == 3:
		kbps = [16]int{0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256}
	default:
		kbps = [16]int{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}
	}
	br := kbps[brIdx] * 1000
	switch {
	case layer == 3: // Layer I
		samples = 384
		n = (12*br/rate + pad) * 4
	case layer == 2 || v1: // Layer II, MPEG-1 Layer III
		samples = 1152
		n = 144*br/rate + pad
	default: // MPEG-2/2.5 Layer III
		samples = 576
		n = 72*br/rate + pad
	}
	if br == 0 {
		n = 0
	}
	return n, samples, rate, true
}

// mp4Boxes calls fn with the type and payload of each box in b, until fn
// returns false; a box whose size runs past b ends the walk.
func mp4Boxes(b []byte, fn func(typ string, body []byte) bool) {
	for len(b) >= 8 {
		size, head := uint64(binary.BigEndian.Uint32(b)), uint64(8)
		switch size {
		case 0:
			size = uint64(len(b))
		case 1:
			if len(b) < 16 {
				return
			}
			size, head = binary.BigEndian.Uint64(b[8:]), 16
		}
		if size < head || size > uint64(len(b)) {
			return
		}
		if !fn(string(b[4:8]), b[head:size]) {
			return
		}
		b = b[size:]
	}
}

// mp4Duration is the length of an MP4/M4A file's AAC track as a decoder
// outputs it: every frame the sample tables list (the larger of stsz's and
// stts's counts) decodes to 1024 samples at the rate its
// AudioSpecificConfig states — not the timestamps the file claims. ok is
// false for a fragmented file, another codec, or no AAC track.
func mp4Duration(f []byte) (float64, bool) {
	var seconds float64
	found, fragmented := false, false
	mp4Boxes(f, func(typ string, moov []byte) bool {
		switch typ {
		case "moof":
			fragmented = true
		case "moov":
			mp4Boxes(moov, func(typ string, trak []byte) bool {
				if typ != "trak" {
					return true
				}
				if s, ok := mp4AACTrack(trak); ok {
					seconds += s
					found = true
				}
				return true
			})
		}
		return true
	})
	return seconds, found && !fragmented
}

// mp4AACTrack is an AAC sound track's decoded length; ok is false for any
// other track.
func mp4AACTrack(trak []byte) (float64, bool) {
	var stbl []byte
	sound := false
	mp4Boxes(trak, func(typ string, mdia []byte) bool {
		if typ == "mdia" {
			mp4Boxes(mdia, func(typ string, b []byte) bool {
				switch typ {
				case "hdlr":
					sound = len(b) >= 12 && string(b[8:12]) == "soun"
				case "minf":
					mp4Boxes(b, func(typ string, b []byte) bool {
						if typ == "stbl" {
							stbl = b
						}
						return true
					})
				}
				return true
			})
		}
		return true
	})
	if !sound || stbl == nil {
		return 0, false
	}
	var frames uint64
	rate := 0
	mp4Boxes(stbl, func(typ string, b []byte) bool {
		switch typ {
		case "stsz":
			if len(b) >= 12 {
				frames = max(frames, uint64(binary.BigEndian.Uint32(b[8:])))
			}
		case "stts":
			if len(b) >= 8 {
				var n uint64
				for i, k := 0, int(binary.BigEndian.Uint32(b[4:])); i < k && 8+8*i+8 <= len(b); i++ {
					n += uint64(binary.BigEndian.Uint32(b[8+8*i:]))
				}
				frames = max(frames, n)
			}
		case "stsd":
			rate = mp4AACRate(b)
		}
		return true
	})
	if rate == 0 || frames == 0 {
		return 0, false
	}
	return float64(frames) * 1024 / float64(rate), true
}

// aacRates are the AudioSpecificConfig's sampling frequency indexes.
var aacRates = [...]int{96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350}

// mp4AACRate reads an stsd box's first entry: an mp4a sample entry's esds,
// its AudioSpecificConfig's (core) sampling rate; 0 for anything else.
func mp4AACRate(stsd []byte) int {
	if len(stsd) < 8+36 || string(stsd[12:16]) != "mp4a" {
		return 0
	}
	entry := stsd[8:]
	if size := int(binary.BigEndian.Uint32(entry)); size >= 36 && size <= len(entry) {
		entry = entry[:size]
	}
	children := 36 // a version 0 sound sample entry
	switch binary.BigEndian.Uint16(entry[16:]) {
	case 1:
		children += 16
	case 2:
		children += 36
	}
	if children > len(entry) {
		return 0
	}
	rate := 0
	mp4Boxes(entry[children:], func(typ string, esds []byte) bool {
		if typ == "esds" && len(esds) > 4 {
			rate = aacConfigRate(esds[4:], 3) // ES, DecoderConfig, DecoderSpecificInfo
			return false
		}
		return true
	})
	return rate
}

// aacConfigRate walks MPEG-4 descriptors (ES, DecoderConfig,
// DecoderSpecificInfo) to the AudioSpecificConfig and returns its sampling
// rate; 0 if it finds none it can read within depth nested descriptors.
func aacConfigRate(d []byte, depth int) int {
	for len(d) >= 2 && depth > 0 {
		tag := d[0]
		n, i := 0, 1
		for {
			if i >= len(d) || i > 4 {
				return 0
			}
			c := d[i]
			i++
			n = n<<7 | int(c&0x7f)
			if c&0x80 == 0 {
				break
			}
		}
		if n > len(d)-i {
			return 0
		}
		body := d[i : i+n]
		switch tag {
		case 3: // ES_Descriptor: ES_ID, flags, optional fields, then descriptors
			if len(body) < 3 {
				return 0
			}
			flags, skip := body[2], 3
			if flags&0x80 != 0 {
				skip += 2
			}
			if flags&0x40 != 0 && skip < len(body) {
				skip += 1 + int(body[skip])
			}
			if flags&0x20 != 0 {
				skip += 2
			}
			if skip > len(body) {
				return 0
			}
			return aacConfigRate(body[skip:], depth-1)
		case 4: // DecoderConfigDescriptor: 13 bytes, then descriptors
			if len(body) < 13 {
				return 0
			}
			return aacConfigRate(body[13:], depth-1)
		case 5: // DecoderSpecificInfo: the AudioSpecificConfig
			if len(body) < 2 || body[0]>>3 == 31 {
				return 0
			}
			idx := int(body[0]&7)<<1 | int(body[1]>>7)
			if idx == 15 {
				if len(body) < 5 {
					return 0
				}
				return int(body[1]&0x7f)<<17 | int(body[2])<<9 | int(body[3])<<1 | int(body[4]>>7)
			}
			if idx >= len(aacRates) {
				return 0
			}
			return aacRates[idx]
		}
		d = d[i+n:]
	}
	return 0
}
