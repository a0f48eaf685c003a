package migrations

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// applied pins each migration's text as arbor applies it (after the guard
// directives are expanded, before the schema is filled in): the SHA-256 of
// its up and of its down. A released migration never changes, whatever
// becomes of the files that hold its text (guard/, internal/guardhistory,
// internal/linediff): a schema migrated by an older arbor and one migrated
// fresh run the same statements. A new migration adds its line here; the
// test's failure gives the hashes.
var applied = map[int][2]string{
	1:  {"95196af6195dc2599c327504b8a17c886e2c282219822a5bc07f98de11216adf", "bdbf08c073419a0acd9315d222fc7176106aba976572f15b6fe6e55d029d4391"},
	2:  {"adf79c4cc3dfe84a562a6ded879fc45f553dca24bd0ce0c0e21f2e833896a384", "4698ea2d893ca81b5571a3c8ffc05936b973ad4ce4c30a764c66dbc6913380e9"},
	3:  {"cb8b138860ac2be0ae8bffaf2bf283bf9490800574c99eaa2e6cf999615e6532", "00cfaabbcf81940071b1ce78418e8f7a343bdccd86ed35c0ef73ffde29f6cba9"},
	4:  {"96bf3bba75eb6fcddff417ae65c355c225f5e1a36d64ea86e0bd527b9b1416bf", "aaf1219c989b333f4a01c34948342bda190bdfde36505380d26abc56266c9b4b"},
	5:  {"09f47a26a49719fd36a04f05d118c0f6a3b4cb7766780441bb02f5216f9a8d54", "436fe605a783a3c112eef5c9ffcf5d1c61533a620288974ef1338e007b82a60c"},
	6:  {"30323d72189680d50cdc17e37a8043a0f0c8873041781af5b0eb10e84145c192", "b152eeb67ae63127ed60386f14d53c29fd2aea190d63120378cc31de546c9d69"},
	7:  {"9c8581cf451bdc53fb6ee56c24fafef78d405b4529ef35bda919450324b18cc5", "8e5c65a1b9b8136d11c003d6f4f2154ab848971abc5b7593ad7003c176750705"},
	8:  {"d5cd32bb81592daa818fd414aa9c0ad28db778b605b15879a6269dc539814917", "2e683be49065915f4b5ceb304eab488fda36edb1e20c026666745baa8e4b0e49"},
	9:  {"2ae22c8afb531d342111c1a6966f09fba1f4ca2fce517cd4c0a864c61bf204fe", "10b1d2b1eb2a43362a2d46e630e2d2699f897ef0e6e5bafb4d6a4b13c27b3958"},
	10: {"eab91dc2716345e52ecfef4694f6b623c60ec87f2e707f4d652b6c6f92faea12", "3d1f6332404bf35a7a93090c9a0ce32339234b4d67c3dea9c641f6148da79244"},
	11: {"eedeac436df3c39de1ee4d0874ed2f2bbf54eab4c397dbe7eba2c897c7d924b1", "02e7e94211148bab4f9fd89a6a01a92a1ae0e768074adbc9999640284ddf0164"},
	12: {"5f057ee42ae9ebf83908a8ec6311ed56eeeb131161e9e089af5c3458c32b9c62", "9284231d031987420fafaf40abc16382bc2927901e0bedd3918b1dab810391a7"},
	13: {"df40e75b97638cb760c08e69375b2b26daafdf58c0fb457c74b10999950d0fde", "1c84a71580890be41dd8f23f6c7fc51cd8d7884b784ad9834f1d01e16d06de19"},
	14: {"d7d57b9b0e4c51108cc72d4677f37a5b459898814e8481d1199cf04c61a9ed53", "3e08f3ff87152ebb13659c2f5b5a07b600611e36801c066315a794cf3c013372"},
	15: {"90f4355538e2bb31b26d372bbdd14dde3192e7470c68e9f16de3968640c2bce3", "3e651ada50036b3cb26302565ce0473d21ad1df0d3d986ef5feb24152ca81d1b"},
	16: {"2216b0ec5e1ed169ce315a30612ced4f16fc551c09497f6270dc3aed640e3f04", "58a92c6231711c8026f448c821db806739601ab74a38a9b4d02c3b927526fc9d"},
	17: {"7dd4c59ddc67b3f1422a6dc91458ec67f77a35ab37bb108784509bc0a723b2d1", "5f84177d6a19fac145ffa3b3bd31a002b5a875b67cb0977d60f6cef57926205a"},
	18: {"60ee9abdce15425bab3346b9d7fbaa51082b89e761d7b01c15e7ea51714f92b9", "4bddaeb8f81adbf2f060bef91c7982677780e3d230176be29b8afcc3e4cdaa7d"},
	19: {"c0f41dafad0419b602b69be52ba4479cbcff225c4d421008d20e28f751f30d24", "26f797ae27f85410d44a363f067c8d88eeeb1bfa9dc52fd849f5f10d57bf0437"},
	20: {"dafda8f72816d4f06b86229f861d7839b7e74ee3aa52fd4e70cd508abf65701b", "8f54091dffad1f4fde710785b2ff909130f119203473f8a3434761e1637dcad7"},
	21: {"f6f078dd106f6f621f7bdaff9f452c2f4e489a0b9b96bc39abdf0e507e2883f0", "9a12e248fdb49981c952f1b28cd26a53ff58a6f176692968903990e759ac9388"},
	22: {"76a17aa3c90e3a560a360efa1f3a9e8eecc7d66607f5a3bc0ff7053d183f8d3d", "1de942b13c89d1ded05fb6a0a7ff0dcb603694c3f1f3f2abb68c8fe2f96b62d9"},
	23: {"c57ad760d77745c6ba64dd30fcea716b4bd389d543c77ce9b8983821e2e76053", "8ff3ad6efe830d93f8d5d083769010ee3af7a72ec0487211c55ba1e7e6cd40b9"},
	24: {"5fb1f5e9b6ac20cc81d7d0f49a11a76f06b5ea3168edf1c9acb0207dc8202b65", "0e6ab8f51030f387fbd2b7e8776d5519eaac40d4bcc603a6a597deef06449acd"},
	25: {"695539ff560c93cffa2f3bbd89bb74fdb50966168df691e00db27ce18122563e", "ef4a21600c4a7075dddb72f30b6407fa5f9cdffb5170184f8a41caa01d2a6fb7"},
	26: {"f14365e2b8bbe93fa2b4ed140b2d964c9757caab327e806dca2f40043f7f32e9", "7d622a70e43aada91efacf19ed1a3a5e850955bc82afa80daf0dc521a4ad2ae8"},
	27: {"3a0ccd0b46ed2b15cf8e203e140574c88fe1be674dd56efe239a1363da51a075", "7c4c9a7b6f420c42ff118c2613f8bf063f3ae579e367a1b2019d09b29c6c1126"},
	28: {"c6473e6669609bef69e904bde899dfc19c9614b96ef8efd1d8ef190444d0e51c", "ff05d7b27714dd353a2098ceb05f6b6f8f655d8043ed79c38f777fec5cc31394"},
	29: {"3215b421f253c46236af8058a984ec9d4b09d2a86c56f153f84e964dd70ab0b6", "132f11059da90e0eddf9fc6907017e0a2fc655ce8e9722013e21572c8c3b0810"},
	30: {"370bf3ac491023d979dfe1a6f56bf78f3c8b2ef09bd6a5db53aa22afe637e3a0", "f093776eac5c38230d7c081e0899694975595eebb81383b78fee343a388872d8"},
	31: {"f16048094bc2f0a881e07c7b3acbc357bb8757ed12b3c7978a0392f7b56f35e8", "098892cdd502523f11622d47c8a9b6f8e1a36e870cc929bba90708349876dff4"},
	32: {"295de2cb736c1934a9e793bd5ea91b5275ecbf9d242ebdf6ef917e272a9f457f", "64e3d7064c8429f8725a63fa06703277ab2b1cc00a3ab9ad14a6968ee6f452c9"},
	33: {"5a4bd6399590002aa6c0cfabbbaeb8e6460180fc9041d39254ac565df78c6112", "2717d0676a5b238308c67a9350ed584fd0c9c8adedcedb8b5710f99098c82443"},
	34: {"32f05190c799b2fd3c669c2fb65fef4d49e9280b02336e7f06620693b1c751ea", "503872015319cc4ca90bfebe579e9cb3b1ee728dfa4e7800cfa0e016861a0877"},
}

func TestMigrationsApplyWhatTheyApplied(t *testing.T) {
	t.Parallel()
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	for _, m := range all {
		want, ok := applied[m.Version]
		if !ok {
			t.Errorf("migration %03d_%s is not pinned: add\n\t%d: {%q, %q},", m.Version, m.Name, m.Version, sum(m.up), sum(m.down))
			continue
		}
		if got := sum(m.up); got != want[0] {
			t.Errorf("migration %03d_%s: its up text changed (SHA-256 %s, released as %s): a released migration never changes; write a new one", m.Version, m.Name, got, want[0])
		}
		if got := sum(m.down); got != want[1] {
			t.Errorf("migration %03d_%s: its down text changed (SHA-256 %s, released as %s): a released migration never changes; write a new one", m.Version, m.Name, got, want[1])
		}
	}
	for v := range applied {
		if v > len(all) {
			t.Errorf("migration %03d is pinned but gone: a released migration is never removed", v)
		}
	}
}
