//! The tree against the RFC 6962 test vectors published with
//! transparency-dev/merkle (`proof/verify_test.go`: the eight reference
//! leaves, the roots of sizes 1–8 and the known-good proofs), against a
//! naive recursive `MTH`, and every proof of every small tree both ways.

use proptest::prelude::*;

use super::*;

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn h(text: &str) -> Hash {
    unhex(text).try_into().unwrap()
}

const LEAVES: [&str; 8] = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
];

/// Roots of sizes 1..=8.
const ROOTS: [&str; 8] = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

fn reference_tree() -> Tree {
    let mut tree = Tree::new();
    for leaf in LEAVES {
        tree.push(leaf_hash(&unhex(leaf)));
    }
    tree
}

#[test]
fn roots_match_rfc6962() {
    let tree = reference_tree();
    assert_eq!(
        tree.root(0).unwrap(),
        h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
    for (size, root) in (1..).zip(ROOTS) {
        assert_eq!(tree.root(size).unwrap(), h(root), "size {size}");
    }
}

#[test]
fn inclusion_proofs_match_the_published_vectors() {
    let tree = reference_tree();
    // (leaf index, tree size, proof)
    let vectors: [(u64, u64, &[&str]); 4] = [
        (
            0,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            5,
            8,
            &[
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            3,
            &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"],
        ),
        (
            1,
            5,
            &[
                "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
    ];
    for (index, size, expected) in vectors {
        let expected: Vec<Hash> = expected.iter().map(|x| h(x)).collect();
        assert_eq!(tree.inclusion_proof(index, size).unwrap(), expected);
        let leaf = tree.leaf(index).unwrap();
        let root = h(ROOTS[size as usize - 1]);
        verify_inclusion(&leaf, index, size, &expected, &root).unwrap();
    }
}

#[test]
fn consistency_proofs_match_the_published_vectors() {
    let tree = reference_tree();
    let vectors: [(u64, u64, &[&str]); 5] = [
        (1, 1, &[]),
        (
            1,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            6,
            8,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            5,
            &[
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
        (
            6,
            7,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
    ];
    for (from, to, expected) in vectors {
        let expected: Vec<Hash> = expected.iter().map(|x| h(x)).collect();
        assert_eq!(tree.consistency_proof(from, to).unwrap(), expected);
        let (old, new) = (h(ROOTS[from as usize - 1]), h(ROOTS[to as usize - 1]));
        verify_consistency(from, to, &old, &new, &expected).unwrap();
    }
}

/// `MTH` straight from RFC 9162's definition.
fn naive_root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split(n as u64) as usize;
            node_hash(&naive_root(&leaves[..k]), &naive_root(&leaves[k..]))
        }
    }
}

fn leaves(n: u64) -> Vec<Hash> {
    (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect()
}

fn tree_of(leaves: &[Hash]) -> Tree {
    let mut tree = Tree::new();
    for leaf in leaves {
        tree.push(*leaf);
    }
    tree
}

#[test]
fn every_proof_of_every_small_tree_verifies_and_wrong_inputs_fail() {
    const N: u64 = 70;
    let all = leaves(N);
    let tree = tree_of(&all);
    let roots: Vec<Hash> = (0..=N).map(|n| naive_root(&all[..n as usize])).collect();
    let other = leaf_hash(b"not in the log");
    for size in 0..=N {
        assert_eq!(tree.root(size).unwrap(), roots[size as usize]);
        for index in 0..size {
            let proof = tree.inclusion_proof(index, size).unwrap();
            let root = &roots[size as usize];
            verify_inclusion(&all[index as usize], index, size, &proof, root).unwrap();
            assert!(verify_inclusion(&other, index, size, &proof, root).is_err());
            assert!(verify_inclusion(&all[index as usize], index, size, &proof, &other).is_err());
            if size > 1 {
                let moved = (index + 1) % size;
                assert!(
                    verify_inclusion(&all[index as usize], moved, size, &proof, root).is_err(),
                    "{index} moved to {moved} in {size}"
                );
            }
            let mut longer = proof.clone();
            longer.push(other);
            assert!(verify_inclusion(&all[index as usize], index, size, &longer, root).is_err());
            if let Some((_, shorter)) = proof.split_last() {
                assert!(
                    verify_inclusion(&all[index as usize], index, size, shorter, root).is_err()
                );
            }
        }
        for from in 0..=size {
            let proof = tree.consistency_proof(from, size).unwrap();
            let (old, new) = (&roots[from as usize], &roots[size as usize]);
            verify_consistency(from, size, old, new, &proof).unwrap();
            if from > 0 && from < size {
                assert!(verify_consistency(from, size, &other, new, &proof).is_err());
                assert!(verify_consistency(from, size, old, &other, &proof).is_err());
                assert!(verify_consistency(from, size, old, new, &[]).is_err());
                for i in 0..proof.len() {
                    let mut flipped = proof.clone();
                    flipped[i][0] ^= 0x10;
                    assert!(verify_consistency(from, size, old, new, &flipped).is_err());
                }
                let mut longer = proof.clone();
                longer.push(other);
                assert!(verify_consistency(from, size, old, new, &longer).is_err());
            }
        }
    }
}

#[test]
fn out_of_range_requests_are_errors_not_panics() {
    let tree = tree_of(&leaves(5));
    assert_eq!(
        tree.inclusion_proof(5, 5),
        Err(ProofError::IndexOutOfRange { index: 5, size: 5 })
    );
    assert_eq!(
        tree.inclusion_proof(0, 6),
        Err(ProofError::SizeOutOfRange {
            size: 6,
            log_size: 5
        })
    );
    assert_eq!(
        tree.consistency_proof(4, 3),
        Err(ProofError::Backwards { from: 4, to: 3 })
    );
    assert!(tree.root(6).is_err());
    let root = tree.root(5).unwrap();
    assert!(verify_inclusion(&root, 0, 0, &[], &root).is_err());
    assert!(verify_consistency(3, 2, &root, &root, &[]).is_err());
    assert!(verify_consistency(5, 5, &root, &empty_root(), &[]).is_err());
}

proptest! {
    #[test]
    fn proofs_verify_for_arbitrary_sizes(n in 1u64..3000, a in any::<u64>(), b in any::<u64>()) {
        let all = leaves(n);
        let tree = tree_of(&all);
        let size = 1 + a % n;
        let index = b % size;
        let root = tree.root(size).unwrap();
        prop_assert_eq!(root, naive_root(&all[..size as usize]));
        let proof = tree.inclusion_proof(index, size).unwrap();
        prop_assert!(verify_inclusion(&all[index as usize], index, size, &proof, &root).is_ok());
        let wrong = leaf_hash(&[0xff; 9]);
        prop_assert!(verify_inclusion(&wrong, index, size, &proof, &root).is_err());

        let from = b % (size + 1);
        let old = tree.root(from).unwrap();
        let proof = tree.consistency_proof(from, size).unwrap();
        prop_assert!(verify_consistency(from, size, &old, &root, &proof).is_ok());
        if from > 0 && from < size {
            prop_assert!(verify_consistency(from, size, &wrong, &root, &proof).is_err());
            prop_assert!(verify_consistency(from, size, &old, &wrong, &proof).is_err());
        }
    }
}
