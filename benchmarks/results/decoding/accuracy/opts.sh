# The options every fit here takes (both clones, every seed)
EPOCHS=6
OPTS=(--model.arch=project.data.stripes.small_convnet --data.batch_size=20 --model.lr=0.05)
